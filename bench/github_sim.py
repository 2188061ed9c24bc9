"""A small, stateful simulation of the GitHub REST API the bot uses, for end-to-end tests.

One ``GitHubSim`` holds a repository's pull requests, issue comments, check runs, commit statuses and
collaborators, and records every call. It answers through ``responses`` (in-process jobs: PyGithub's
``https://api.github.com:443/...`` requests) or as a tiny WSGI server on a loopback port (jobs in forked
workers, which ``responses`` cannot reach). JSON shapes follow GitHub's REST documentation; URLs inside
bodies are written without the explicit ``:443``, as GitHub writes them. Failures (5xx, rate limits) can
be injected for the next matching calls.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import responses
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

API = "https://api.github.com"
APP_ID = "4242"
SLUG = "kilolock-test"
APP_LOGIN = f"{SLUG}[bot]"
TOKEN_LOGIN = "kilolock-ci"
INSTALLATION = 777


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict[str, Any] | None
    status: int
    at: float = field(default_factory=time.monotonic)


@dataclass
class Failure:
    method: str
    pattern: re.Pattern[str]
    status: int
    headers: dict[str, str]
    times: int
    after: bool = False  # perform the call, then answer with the failure (the answer was lost)


@dataclass
class GitHubSim:
    repo: str
    mode: str = "app"  # "app" (check runs) or "token" (commit statuses)
    default_branch: str = "main"
    base_url: str = API
    prs: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    permissions: dict[str, str] = field(default_factory=dict)
    teams: dict[str, set[str]] = field(default_factory=dict)  # "org/team" → the logins of its active members
    commit_authors: dict[str, str] = field(default_factory=dict)  # sha → the GitHub login of its author
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1001))
    _issue_numbers: Iterator[int] = field(default_factory=lambda: itertools.count(501))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bot_login(self) -> str:
        return APP_LOGIN if self.mode == "app" else TOKEN_LOGIN

    # --- the world the tests change ----------------------------------------------------------

    def open_pr(self, number: int, *, head_sha: str, head_ref: str, base_sha: str, author: str = "alice",
                head_repo: str | None = None, base_ref: str | None = None) -> None:
        """``head_repo`` names the fork the head lives in (default: this repository); ``base_ref`` the
        branch the pull request merges into (default: the default branch)."""
        self.prs[number] = {"number": number, "head_sha": head_sha, "head_ref": head_ref, "base_sha": base_sha,
                            "state": "open", "merged": False, "author": author, "merge_commit_sha": None,
                            "mergeable": True, "mergeable_state": "clean", "reviews": [],
                            "head_repo": head_repo or self.repo, "base_ref": base_ref or self.default_branch}
        self.commit_authors.setdefault(head_sha, author)

    def reopen_pr(self, number: int) -> None:
        self.prs[number].update(state="open", merged=False, merge_commit_sha=None)

    def push_pr(self, number: int, head_sha: str, *, pusher: str | None = None) -> None:
        """A new head; its commit's author is ``pusher`` (default: the pull request's author)."""
        self.prs[number]["head_sha"] = head_sha
        self.commit_authors[head_sha] = pusher or self.prs[number]["author"]

    def merge_pr(self, number: int, merge_sha: str) -> None:
        self.prs[number].update(state="closed", merged=True, merge_commit_sha=merge_sha)

    def close_pr(self, number: int) -> None:
        """Closed without merging: GitHub still fills merge_commit_sha (a test merge), merged stays false."""
        self.prs[number].update(state="closed", merged=False, merge_commit_sha="f" * 40)

    def review(self, number: int, login: str, state: str, *, commit_id: str | None = None) -> dict[str, Any]:
        """Submit a review (``APPROVED``, ``CHANGES_REQUESTED``, ``COMMENTED``) on the PR's head (or ``commit_id``)."""
        pr = self.prs[number]
        review = {"id": next(self._ids), "user": {"login": login, "id": 5, "type": "User"}, "state": state,
                  "commit_id": commit_id or pr["head_sha"], "submitted_at": "2026-12-01T10:00:00Z",
                  "body": "", "html_url": f"https://github.com/{self.repo}/pull/{number}"}
        pr["reviews"].append(review)
        return review

    def fail(self, method: str, path_regex: str, status: int, *, times: int = 1,
             headers: dict[str, str] | None = None, after: bool = False) -> None:
        """Answer the next ``times`` matching calls with ``status`` (and ``headers``) instead; with
        ``after`` the call takes effect first and only its answer is lost."""
        self.failures.append(Failure(method, re.compile(path_regex), status, headers or {}, times, after))

    # --- what the tests read -----------------------------------------------------------------

    def pr_comments(self, number: int) -> list[dict[str, Any]]:
        return [c for c in self.comments.values() if c["issue"] == number]

    def bot_comment(self, number: int) -> str:
        mine = [c for c in self.pr_comments(number) if c["user"] == self.bot_login]
        assert len(mine) == 1, f"#{number} has {len(mine)} bot comments"
        return str(mine[0]["body"])

    def runs(self, name: str | None = None, sha: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.check_runs.values() if (name is None or r["name"] == name)
                and (sha is None or r["head_sha"] == sha)]

    def writes(self) -> list[tuple[str, str]]:
        """(method, path) of every successful write, in order."""
        return [(c.method, c.path) for c in self.calls if c.method in ("POST", "PATCH") and c.status < 300
                and "access_tokens" not in c.path]

    # --- answering ---------------------------------------------------------------------------

    def handle(self, method: str, url: str, raw_body: bytes | str | None) -> tuple[int, dict[str, str], Any]:
        parts = urlsplit(url)
        path = parts.path
        base_path = urlsplit(self.base_url).path.rstrip("/")
        if base_path and path.startswith(base_path):
            path = path[len(base_path):]
        query = parse_qs(parts.query)
        body = json.loads(raw_body) if raw_body else None
        with self._lock:
            for failure in self.failures:
                if failure.times > 0 and failure.method == method and failure.pattern.search(path):
                    failure.times -= 1
                    if failure.after:
                        self._route(method, path, query, body or {})
                    self.calls.append(Call(method, path, query, body, failure.status))
                    message = "API rate limit exceeded" if failure.status in (403, 429) else "Server Error"
                    return failure.status, failure.headers, {"message": message}
            status, payload = self._route(method, path, query, body or {})
            self.calls.append(Call(method, path, query, body, status))
            return status, {}, payload

    def _route(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any]) -> tuple[int, Any]:
        r = f"/repos/{self.repo}"
        if method == "GET" and path == f"{r}/installation":
            return 200, {"id": INSTALLATION, "app_id": int(APP_ID), "app_slug": SLUG,
                         "account": {"login": self.repo.split("/")[0]}}
        if method == "POST" and path == f"/app/installations/{INSTALLATION}/access_tokens":
            expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            return 201, {"token": "ghs_" + "T" * 36, "expires_at": expires}
        if method == "GET" and path == "/user":
            return 200, {"login": TOKEN_LOGIN, "id": 7}
        if method == "GET" and path == r:
            return 200, {"full_name": self.repo, "name": self.repo.split("/")[1], "default_branch": self.default_branch,
                         "url": f"{self.base_url}{r}"}
        if (m := re.fullmatch(rf"{r}/pulls/(\d+)/reviews", path)) and method == "GET":
            pr = self.prs.get(int(m.group(1)))
            return (200, list(pr["reviews"])) if pr else (404, {"message": "Not Found"})
        if m := re.fullmatch(rf"{r}/pulls/(\d+)", path):
            pr = self.prs.get(int(m.group(1)))
            return (200, self._pr_json(pr)) if pr else (404, {"message": "Not Found"})
        if m := re.fullmatch(rf"{r}/issues/(\d+)/comments", path):
            number = int(m.group(1))
            if method == "GET":
                return 200, [self._comment_json(c) for c in sorted(self.comments.values(), key=lambda c: c["id"])
                             if c["issue"] == number]
            comment = {"id": next(self._ids), "issue": number, "body": body["body"], "user": self.bot_login}
            self.comments[comment["id"]] = comment
            return 201, self._comment_json(comment)
        if (m := re.fullmatch(rf"{r}/issues/comments/(\d+)", path)) and method == "PATCH":
            comment = self.comments[int(m.group(1))]
            comment["body"] = body["body"]
            return 200, self._comment_json(comment)
        if (m := re.fullmatch(rf"{r}/commits/([0-9a-f]+)/check-runs", path)) and method == "GET":
            name = (query.get("check_name") or [None])[0]
            found = [run for run in self.check_runs.values() if run["head_sha"] == m.group(1)
                     and (name is None or run["name"] == name)]
            if (query.get("filter") or ["latest"])[0] == "latest":
                latest: dict[str, dict[str, Any]] = {}
                for run in sorted(found, key=lambda x: x["id"]):
                    latest[run["name"]] = run
                found = list(latest.values())
            return 200, {"total_count": len(found), "check_runs": [self._run_json(x) for x in found]}
        if method == "POST" and path == f"{r}/check-runs":
            if self.mode != "app":
                return 403, {"message": "Resource not accessible by personal access token"}
            run = {"id": next(self._ids), "name": body["name"], "head_sha": body["head_sha"], "history": []}
            self._update_run(run, body)
            self.check_runs[run["id"]] = run
            return 201, self._run_json(run)
        if (m := re.fullmatch(rf"{r}/check-runs/(\d+)", path)) and method == "PATCH":
            run = self.check_runs[int(m.group(1))]
            self._update_run(run, body)
            return 200, self._run_json(run)
        if (m := re.fullmatch(rf"{r}/statuses/([0-9a-f]+)", path)) and method == "POST":
            status = {"sha": m.group(1), **body}
            self.statuses.append(status)
            return 201, {"id": next(self._ids), "url": f"{self.base_url}{path}", **body}
        if path == f"{r}/issues" and method == "GET":
            state = (query.get("state") or ["open"])[0]
            creator = (query.get("creator") or [None])[0]
            return 200, [self._issue_json(i) for n, i in sorted(self.issues.items())
                         if (state == "all" or i["state"] == state) and creator in (None, i["user"])]
        if path == f"{r}/issues" and method == "POST":
            issue = {"number": next(self._issue_numbers), "title": body["title"], "body": body.get("body", ""),
                     "state": "open", "user": self.bot_login, "state_reason": None, "history": ["opened"]}
            self.issues[issue["number"]] = issue
            return 201, self._issue_json(issue)
        if (m := re.fullmatch(rf"{r}/issues/(\d+)", path)) and int(m.group(1)) in self.issues:
            issue = self.issues[int(m.group(1))]
            if method == "PATCH":
                if body.get("state") and body["state"] != issue["state"]:
                    issue["history"].append("reopened" if body["state"] == "open" else "closed")
                for key in ("title", "body", "state", "state_reason"):
                    if key in body:
                        issue[key] = body[key]
            return 200, self._issue_json(issue)
        if (m := re.fullmatch(rf"{r}/commits/([0-9a-f]{{40}})", path)) and method == "GET":
            login = self.commit_authors.get(m.group(1))
            user = {"login": login, "id": 3, "type": "User"} if login else None
            return 200, {"sha": m.group(1), "url": f"{self.base_url}{path}", "author": user, "committer": user,
                         "commit": {"message": "", "author": {"name": login or "someone"}}}
        if (m := re.fullmatch(r"/orgs/([^/]+)/teams/([^/]+)/memberships/([^/]+)", path)) and method == "GET":
            members = self.teams.get(f"{m.group(1)}/{m.group(2)}".lower())
            if members is None or m.group(3).lower() not in {x.lower() for x in members}:
                return 404, {"message": "Not Found"}
            return 200, {"state": "active", "role": "member", "url": f"{self.base_url}{path}"}
        if m := re.fullmatch(rf"{r}/collaborators/([^/]+)/permission", path):
            permission = self.permissions.get(m.group(1))
            if permission is None:
                return 404, {"message": "Not Found"}
            return 200, {"permission": permission, "user": {"login": m.group(1)}}
        return 404, {"message": f"not simulated: {method} {path}"}

    def _update_run(self, run: dict[str, Any], body: dict[str, Any]) -> None:
        for key in ("status", "conclusion", "external_id", "output"):
            if key in body:
                run[key] = body[key]
        run["history"].append((body.get("status"), body.get("conclusion")))

    def _pr_json(self, pr: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/repos/{self.repo}/pulls/{pr['number']}"
        return {
            "id": pr["number"] * 100, "number": pr["number"], "state": pr["state"], "merged": pr["merged"],
            "merge_commit_sha": pr["merge_commit_sha"], "url": url, "title": f"PR {pr['number']}",
            "mergeable": pr.get("mergeable", True), "mergeable_state": pr.get("mergeable_state", "clean"),
            "user": {"login": pr["author"], "id": 1, "type": "User"},
            "head": {"sha": pr["head_sha"], "ref": pr["head_ref"], "label": f"x:{pr['head_ref']}",
                     "repo": self._repo_json(pr.get("head_repo") or self.repo)},
            "base": {"sha": pr["base_sha"], "ref": pr.get("base_ref") or self.default_branch,
                     "label": f"x:{pr.get('base_ref') or self.default_branch}", "repo": self._repo_json(self.repo)},
        }

    def _repo_json(self, full_name: str) -> dict[str, Any]:
        return {"full_name": full_name, "name": full_name.split("/")[1], "fork": full_name != self.repo,
                "url": f"{self.base_url}/repos/{full_name}", "owner": {"login": full_name.split("/")[0]}}

    def _comment_json(self, comment: dict[str, Any]) -> dict[str, Any]:
        return {"id": comment["id"], "body": comment["body"],
                "user": {"login": comment["user"], "id": 9, "type": "Bot" if "[bot]" in comment["user"] else "User"},
                "url": f"{self.base_url}/repos/{self.repo}/issues/comments/{comment['id']}",
                "html_url": f"https://github.com/{self.repo}/pull/{comment['issue']}#issuecomment-{comment['id']}"}

    def _issue_json(self, issue: dict[str, Any]) -> dict[str, Any]:
        return {"id": issue["number"] * 10, "number": issue["number"], "title": issue["title"],
                "body": issue["body"], "state": issue["state"], "state_reason": issue["state_reason"],
                "user": {"login": issue["user"], "id": 9, "type": "Bot" if "[bot]" in issue["user"] else "User"},
                "url": f"{self.base_url}/repos/{self.repo}/issues/{issue['number']}",
                "html_url": f"https://github.com/{self.repo}/issues/{issue['number']}"}

    def _run_json(self, run: dict[str, Any]) -> dict[str, Any]:
        return {"id": run["id"], "name": run["name"], "head_sha": run["head_sha"], "status": run.get("status"),
                "conclusion": run.get("conclusion"), "external_id": run.get("external_id", ""),
                "output": run.get("output") or {}, "url": f"{self.base_url}/repos/{self.repo}/check-runs/{run['id']}",
                "app": {"id": int(APP_ID), "slug": SLUG}}

    # --- adapters ----------------------------------------------------------------------------

    def install(self, mock: responses.RequestsMock) -> None:
        """Answer every ``https://api.github.com[:443]`` request of ``mock`` from this simulation."""
        def callback(request: Any) -> tuple[int, dict[str, str], str]:
            status, headers, payload = self.handle(request.method, request.url, request.body)
            return status, {"Content-Type": "application/json", **headers}, json.dumps(payload)

        pattern = re.compile(r"https://api\.github\.com(:443)?/.*")
        for method in ("GET", "POST", "PATCH", "PUT", "DELETE"):
            mock.add_callback(method, pattern, callback=callback)

    @classmethod
    def served(cls, repo: str, **kwargs: Any) -> tuple[GitHubSim, Callable[[], None]]:
        """A simulation served over HTTP on a loopback port (its ``base_url``), and how to stop it."""
        server = make_server("127.0.0.1", 0, lambda e, s: sim.wsgi(e, s), threaded=True)
        sim = cls(repo, base_url=f"http://127.0.0.1:{server.server_port}", **kwargs)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()

        def stop() -> None:
            server.shutdown()
            thread.join(timeout=5)

        return sim, stop

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        status, headers, payload = self.handle(request.method, request.url, request.get_data())
        response = Response(json.dumps(payload), status=status, content_type="application/json", headers=headers)
        return response(environ, start_response)
