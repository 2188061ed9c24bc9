"""The end-to-end world of the bot tests: a real Kilolock server (Flask, Postgres) with the webhook, the
test Redis and RQ workers, a bare "origin" repository in a temp dir that the workers clone through
``KL_GITHUB_CLONE_URLS``, a working clone where pull requests are made and merged, a trunk applied with
the embedded Terraform, and GitHub's API simulated (``bench.github_sim``).

Webhook payloads are GitHub's published examples (``bench.webhooks``) with the repository, numbers
and SHAs of this world filled in.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import responses
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.registry import FailedJobRegistry, ScheduledJobRegistry

from app.config import Settings
from app.queue import QUEUE_NAME
from bench import webhooks
from bench.github_sim import APP_ID, GitHubSim
from runner.bot import jobs
from runner.bot.github import GitHub
from tests.conftest import TRUNK_FILES, Workdir, edit_file, git, held_until, terraform_env, write_file

REPO = "octo-org/infra"
SERIALIZER = "rq.serializers.JSONSerializer"
# The trunk every scenario starts from (terraform_data only; provisioners make applies slow or fail on purpose).
FILES = {
    **TRUNK_FILES,
    "db.tf": 'resource "terraform_data" "db" {\n  input = "${local.prefix}-db-v1"\n}\n\n'
             '# Backups are kept for a week.\n\n'
             'resource "terraform_data" "db_backup" {\n  input = "backup-v1"\n}\n',
    "queue.tf": 'resource "terraform_data" "queue" {\n  input = "queue-v1"\n}\n',
}


def slow(name: str, version: str, seconds: float | str, *, fail: bool = False, until: Path | None = None) -> str:
    """A resource whose replacement runs a provisioner: slow (``sleep``), held until the file ``until`` exists
    (``held_until``), or failing (``exit 1``)."""
    command = "exit 1" if fail else held_until(until) if until is not None else f"sleep {seconds}"
    return (f'resource "terraform_data" "{name}" {{\n  triggers_replace = "{version}"\n'
            f'  provisioner "local-exec" {{\n    command = "{command}"\n  }}\n}}\n')


@dataclass
class World:
    tmp: Path
    server_url: str
    origin: Path
    work: Path
    settings: Settings
    sim: GitHubSim
    redis_url: str
    tf_env: dict[str, str]
    delivered: list[requests.Response] = field(default_factory=list)

    # --- git: pull requests and merges -----------------------------------------------------------

    def head(self, ref: str = "HEAD") -> str:
        return git(self.work, "rev-parse", ref)

    def write(self, name: str, text: str) -> None:
        write_file(self.work, name, text)

    def edit(self, name: str, old: str, new: str) -> None:
        edit_file(self.work, name, old, new)

    def commit(self, branch: str, files: dict[str, str | None], message: str, *, start: str = "main") -> str:
        """Commit ``files`` (None deletes) on ``branch`` (created from ``start``) and push it to origin."""
        existing = git(self.work, "branch", "--list", branch)
        git(self.work, "checkout", "-q", branch if existing else "-b", *([] if existing else [branch, start]))
        for name, text in files.items():
            if text is None:
                (self.work / name).unlink()
            else:
                self.write(name, text)
        git(self.work, "add", "-A")
        git(self.work, "commit", "-qm", message)
        git(self.work, "push", "-q", "origin", branch)
        sha = self.head()
        git(self.work, "checkout", "-q", "main")
        return sha

    def open_pr(self, number: int, branch: str, files: dict[str, str | None], *, deliver: bool = True,
                author: str = "alice", fork: str | None = None, base: str = "main") -> str:
        """A pull request from ``branch`` (made from ``base``) into ``base``; ``fork`` names the repository
        its head lives in on GitHub (its commits are in origin all the same, as GitHub's refs/pull/N/head)."""
        head = self.commit(branch, files, f"PR {number}", start=base)
        self.sim.open_pr(number, head_sha=head, head_ref=branch, base_sha=self.head(base), author=author,
                         head_repo=fork, base_ref=base)
        if deliver:
            self.deliver_pr("opened", number)
        return head

    def push_pr(self, number: int, files: dict[str, str | None], *, deliver: bool = True,
                pusher: str | None = None) -> str:
        branch = self.sim.prs[number]["head_ref"]
        head = self.commit(branch, files, f"PR {number}, more")
        self.sim.push_pr(number, head, pusher=pusher)
        if deliver:
            self.deliver_pr("synchronize", number)
        return head

    def merge(self, number: int, *, deliver: bool = True) -> str:
        """Merge the PR's branch into main with a merge commit (as GitHub's merge button does)."""
        branch = self.sim.prs[number]["head_ref"]
        git(self.work, "checkout", "-q", "main")
        git(self.work, "merge", "-q", "--no-ff", "-m", f"Merge pull request #{number} from octo-org/{branch}",
            branch)
        git(self.work, "push", "-q", "origin", "main")
        sha = self.head("main")
        self.sim.merge_pr(number, sha)
        if deliver:
            self.deliver_merged(number)
        return sha

    # --- webhooks ------------------------------------------------------------------------------

    def post(self, event: str, doc: dict[str, Any], *, delivery: str | None = None) -> requests.Response:
        body = webhooks.encode(doc)
        response = requests.post(f"{self.server_url}/webhooks/github", data=body, timeout=10,
                                 headers=webhooks.headers(event, body, delivery=delivery))
        assert response.status_code in (200, 202), response.text
        self.delivered.append(response)
        return response

    def pr_payload(self, action: str, number: int, *, head_sha: str | None = None) -> dict[str, Any]:
        pr = self.sim.prs[number]
        doc = webhooks.merged_payload() if action == "merged" else webhooks.payload(
            "pull_request/closed" if action == "closed" else "pull_request/opened")
        doc["action"] = "closed" if action == "merged" else action
        doc["number"] = number
        body = doc["pull_request"]
        body.update(number=number, merged=action == "merged", state="closed" if action in ("closed", "merged")
                    else "open", merge_commit_sha=pr["merge_commit_sha"] or "0" * 40)
        body["head"]["sha"] = head_sha or pr["head_sha"]
        body["head"]["ref"] = pr["head_ref"]
        body["base"]["sha"] = pr["base_sha"]
        body["base"]["ref"] = "main"
        return self._repository(doc)

    def deliver_pr(self, action: str, number: int, *, head_sha: str | None = None,
                   delivery: str | None = None) -> requests.Response:
        return self.post("pull_request", self.pr_payload(action, number, head_sha=head_sha), delivery=delivery)

    def deliver_merged(self, number: int) -> requests.Response:
        return self.post("pull_request", self.pr_payload("merged", number))

    def deliver_push(self, before: str, after: str) -> requests.Response:
        doc = webhooks.payload("push/with-new-branch")
        doc.update(ref="refs/heads/main", before=before, after=after, created=False, deleted=False)
        return self.post("push", self._repository(doc))

    def deliver_comment(self, number: int, body: str, *, login: str = "alice", comment_id: int = 5551
                        ) -> requests.Response:
        doc = webhooks.issue_comment_payload(body, login=login, comment_id=comment_id)
        doc["issue"]["number"] = number
        return self.post("issue_comment", self._repository(doc))

    def deliver_review(self, number: int, login: str, state: str) -> requests.Response:
        """Submit a review in the simulation and deliver its ``pull_request_review`` event."""
        review = self.sim.review(number, login, state.upper())
        doc = webhooks.review_payload(state=state.lower(), login=login, review_id=review["id"])
        doc["pull_request"].update(number=number)
        doc["pull_request"]["head"]["sha"] = self.sim.prs[number]["head_sha"]
        doc["review"]["commit_id"] = self.sim.prs[number]["head_sha"]
        return self.post("pull_request_review", self._repository(doc))

    def deliver_rerun(self, external_id: str, head_sha: str) -> requests.Response:
        doc = webhooks.check_run_payload(external_id=external_id, app_id=int(APP_ID))
        doc["check_run"]["head_sha"] = head_sha
        return self.post("check_run", self._repository(doc))

    def _repository(self, doc: dict[str, Any]) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        repository = doc["repository"]
        owner, name = REPO.split("/")
        repository.update(full_name=REPO, name=name, default_branch="main")
        repository["owner"]["login"] = owner
        return doc

    # --- workers ---------------------------------------------------------------------------------

    def connection(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def queue(self) -> Queue:
        return Queue(QUEUE_NAME, connection=self.connection(), serializer=SERIALIZER)

    def run_jobs(self, *, retries_now: bool = True, max_jobs: int | None = None) -> None:
        """Run every queued job in this process (``SimpleWorker``, burst), or only the next ``max_jobs``; with
        ``retries_now`` the retries RQ scheduled for later are run too, until nothing is left."""
        for _ in range(20):
            SimpleWorker([self.queue()], connection=self.connection(), serializer=SERIALIZER).work(
                burst=True, logging_level="WARNING", max_jobs=max_jobs)
            if max_jobs is not None:
                return
            if not retries_now or not self.requeue_scheduled():
                return
        raise AssertionError("jobs kept being retried")

    def requeue_scheduled(self) -> int:
        queue = self.queue()
        registry = ScheduledJobRegistry(queue=queue)
        ids = registry.get_job_ids()
        for job_id in ids:
            job = Job.fetch(job_id, connection=queue.connection, serializer=SERIALIZER)
            registry.remove(job)
            queue.enqueue_job(job)
        return len(ids)

    def failed_jobs(self) -> list[str]:
        return FailedJobRegistry(queue=self.queue()).get_job_ids()

    def start_workers(self, count: int) -> list[subprocess.Popen[str]]:
        """Forking RQ workers (``kl worker --burst``) in subprocesses, as in production."""
        env = {**self.tf_env, "PATH": os.environ["PATH"], "HOME": str(self.tmp),
               "KL_DATABASE_URL": self.settings.database_url or "", "KL_REDIS_URL": self.redis_url,
               "KL_GITHUB_TOKEN": "ghp_" + "W" * 36, "KL_GITHUB_API_URL": self.settings.github_api_url,
               "KL_GITHUB_CLONE_URLS": f"{REPO}={self.origin}", "KL_REPO_CACHE_DIR": str(self.tmp / "cache"),
               "KL_DATA_DIR": str(self.tmp / "kl-data"), "KL_LOG_LEVEL": "INFO",
               "KL_JOB_TIMEOUT": str(self.settings.job_timeout)}
        kl = str(Path(sys.executable).with_name("kl"))
        return [subprocess.Popen([kl, "worker", "--burst", "--no-scheduler", "--name", f"w{i}-{os.getpid()}"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for i in range(count)]

    # --- the server ------------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = requests.get(f"{self.server_url}/v1/engine/runs?state=infra",
                                                   timeout=10).json()["runs"]
        return found

    def trunk(self) -> dict[str, Any]:
        """The trunk as Terraform reads it: address → the instance's ``input``/``triggers_replace``."""
        doc = requests.get(f"{self.server_url}/v1/states/infra", timeout=10).json()
        found: dict[str, Any] = {}
        for res in doc["resources"]:
            for inst in res["instances"]:
                key = f"[{inst['index_key']}]" if "index_key" in inst else ""
                attrs = inst["attributes"]
                value = attrs.get("input") or attrs.get("triggers_replace")
                found[f"{res['type']}.{res['name']}{key}"] = value.get("value") if isinstance(value, dict) else value
        return found

    def serial(self) -> int:
        return int(requests.get(f"{self.server_url}/v1/states/infra", timeout=10).json()["serial"])


def fast_github(settings: Settings, repo: str) -> GitHub:
    """GitHub clients without PyGithub's pause between writes and without real sleeps between retries."""
    return GitHub.for_repo(settings, repo, sleep=lambda seconds: None, throttle=False)


@pytest.fixture
def world_factory(tmp_path: Path, live_server_factory: Any, redis_url: str, clean_db: str, bot_db: Any,
                  monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Build a world: ``make(mode="app"|"token", files=…, kilolock_yml=…, served=False)``."""
    stops: list[Any] = []

    def make(*, mode: str = "app", files: dict[str, str] | None = None, kilolock_yml: str | None = None,
             served: bool = False, job_timeout: int = 600, extra_env: dict[str, str] | None = None,
             repositories: tuple[str, ...] = (), untrusted_previews: tuple[str, ...] = (),
             server_settings: dict[str, Any] | None = None,
             backend: Callable[[Any], tuple[str, dict[str, str]]] | None = None) -> World:
        """``server_settings`` override the live server's; ``backend(server)`` gives the trunk's backend address
        and the variables Terraform needs to seed it (the default: the open-mode state ``infra``)."""
        server = live_server_factory(github_webhook_secret=webhooks.SECRET, redis_url=redis_url,
                                     github_repositories=(REPO, *repositories), **(server_settings or {}))
        home = tmp_path / "tf-home"
        home.mkdir(exist_ok=True)
        tf_env = {**terraform_env(home), **(extra_env or {})}
        for key in ("KL_TERRAFORM_BIN", "TF_CLI_CONFIG_FILE", "TF_IN_AUTOMATION", "CHECKPOINT_DISABLE", "TF_INPUT",
                    *(extra_env or {})):
            monkeypatch.setenv(key, tf_env[key])
        work = tmp_path / "work"
        work.mkdir()
        address, seed_env = backend(server) if backend is not None else (server.state_url("infra"), {})
        env = {**tf_env, "PATH": os.environ["PATH"], "HOME": str(tmp_path), **seed_env}
        workdir = Workdir(work, address, env)
        if kilolock_yml is not None:
            workdir.write(".kilolock.yml", kilolock_yml)
        workdir.seed(files or FILES)
        (work / ".gitignore").write_text(".terraform/\n.terraform.lock.hcl\n*.tfstate*\n")
        git(work, "init", "-q", "-b", "main")
        git(work, "add", "-A")
        git(work, "commit", "-qm", "trunk")
        origin = tmp_path / "origin.git"
        git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
        git(work, "remote", "add", "origin", str(origin))
        git(work, "push", "-q", "origin", "main")
        if served:
            sim, stop = GitHubSim.served(REPO, mode=mode)
            stops.append(stop)
        else:
            sim = GitHubSim(REPO, mode=mode)
            mock = responses.RequestsMock(assert_all_requests_are_fired=False)
            mock.add_passthru("http://127.0.0.1")
            mock.add_passthru("http://localhost")
            sim.install(mock)
            mock.start()
            stops.append(lambda: (mock.stop(), mock.reset()))
        sim.permissions.update(alice="write", bob="write", carol="admin", mallory="read")
        settings = replace(server.settings, github_webhook_secret=None, github_api_url=sim.base_url,
                           github_clone_urls=((REPO, str(origin)),), repo_cache_dir=tmp_path / "cache",
                           data_dir=tmp_path / "kl-data", job_timeout=job_timeout, redis_url=redis_url,
                           github_untrusted_previews=untrusted_previews,
                           **_credentials(mode, request))
        jobs.configure(settings, github=fast_github)
        return World(tmp_path, server.url, origin, work, settings, sim, redis_url, tf_env)

    yield make
    for stop in reversed(stops):
        stop()
    jobs.configure(Settings())


def _credentials(mode: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if mode == "token":
        return {"github_token": "ghp_" + "P" * 36, "github_app_id": None, "github_private_key": None}
    return {"github_app_id": APP_ID, "github_private_key": _app_private_key(), "github_token": None}


@functools.cache
def _app_private_key() -> str:
    """The GitHub App's private key (PEM): made once per session, as no test changes or inspects it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def comment_globs(body: str) -> dict[str, list[str]]:
    """The reservation rows of a rendered comment: mode → globs, in order."""
    found: dict[str, list[str]] = {"write": [], "read": []}
    for line in body.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) == 2 and parts[0] in found and parts[1].startswith("`"):
            found[parts[0]].append(parts[1].strip("`"))
    return found


def dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)
