"""The bot's own credentials per project: ``KL_BOT_PROJECT_TOKENS`` (parsing, validation, redaction, which
token a project gets), ``kl tokens create --scopes-from-owners``, and a merge apply in database auth mode whose
project token — scoped from the default branch's ``owners:`` — lets the server accept a change inside the
project's globs and refuse (403 ``address_scope``, before Terraform applies) one outside them."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from app.config import AuthMode, BotProjectToken, Settings
from app.errors import ConfigError
from runner.bot import jobs
from runner.bot.credentials import engine_token
from tests.bot.botworld import FILES, REPO, World, fast_github, world_factory  # noqa: F401
from tests.bot.test_apply_before_merge import comment, holds_of, replies

SECRET_A, SECRET_B, FALLBACK = "kl_" + "a" * 40, "kl_" + "b" * 40, "kl_" + "f" * 40


def settings_with(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "bot-tokens.json"
    path.write_text(text)
    return Settings.from_env({"KL_BOT_PROJECT_TOKENS": str(path), "KL_BOT_TOKEN": FALLBACK})


def test_project_tokens_are_read_from_a_json_file_chosen_per_project_and_kept_secret(tmp_path: Path):
    settings = settings_with(tmp_path, json.dumps({"Octo-Org/Infra:payments": SECRET_A, "octo-org/infra": SECRET_B,
                                                   "octo-org/other:né": SECRET_B}))
    assert engine_token(settings, "octo-org/infra", "payments").secret == SECRET_A
    assert engine_token(settings, "octo-org/infra", "payments").source == \
        "KL_BOT_PROJECT_TOKENS entry 'Octo-Org/Infra:payments'"
    assert engine_token(settings, "OCTO-ORG/INFRA", "network").secret == SECRET_B  # the repository's entry
    assert engine_token(settings, "octo-org/other", "né").secret == SECRET_B
    fallback = engine_token(settings, "octo-org/other", "Né")  # project names match exactly
    assert (fallback.secret, fallback.source) == (FALLBACK, "KL_BOT_TOKEN")
    assert {SECRET_A, SECRET_B, FALLBACK} <= set(settings.secret_values())
    assert SECRET_A not in repr(settings) and SECRET_A not in repr(settings.bot_project_tokens)
    assert SECRET_A not in repr(engine_token(settings, "octo-org/infra", "payments"))
    assert Settings.from_env({}).bot_project_tokens == ()


@pytest.mark.parametrize(("text", "expected"), [
    (None, "cannot be read (No such file or directory)"),
    ("{nope", "is not JSON (line 1, column 2"),
    (json.dumps([SECRET_A]), "must hold a JSON object"),
    (json.dumps({"infra:payments": SECRET_A}), "entry 'infra:payments': the key must be owner/repo:project"),
    (json.dumps({"a/b:c:d": SECRET_A}), "entry 'a/b:c:d': the key must be"),
    (json.dumps({"a/b:": SECRET_A}), "entry 'a/b:': the key must be"),
    (json.dumps({"a/b:c": ["x"]}), "entry 'a/b:c': the value must be the token's secret"),
    (json.dumps({"a/b:c": f"{SECRET_A} x"}), "entry 'a/b:c': the value must be the token's secret"),
    ('{"a/b:c": "' + SECRET_A + '", "A/B:c": "' + SECRET_B + '"}', "entry 'A/B:c' is given twice"),
])
def test_a_bad_project_tokens_file_stops_the_start_naming_the_entry_never_a_token(tmp_path: Path, text, expected):
    path = tmp_path / "bot-tokens.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"KL_BOT_PROJECT_TOKENS": str(path)})
    message = str(caught.value)
    assert "KL_BOT_PROJECT_TOKENS" in message and expected in message, message
    assert SECRET_A not in message and SECRET_B not in message


# --- end to end: kl tokens create --scopes-from-owners, then a merge apply in database mode ----------------

CONTROL = "ctl-bot-tokens"
CTL = {"Authorization": f"Bearer {CONTROL}"}
DB = ("terraform_data.db", "terraform_data.db.*", "terraform_data.db_backup", "terraform_data.db_backup.*")
KILOLOCK_YML = ('apply_requirements: []\napply_on_comment: true\n'
                'owners:\n  "terraform_data.net": "@octo-org/platform"\n'
                'projects:\n  - dir: .\n    name: infra\n    owners:\n'
                + "".join(f'      "{glob}": "@octo-org/dba"\n' for glob in DB)
                + '      "terraform_data.queue": []\n')


def kl(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("kl")), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def database_world(world_factory) -> tuple[World, dict[str, str], str]:  # noqa: F811
    """A bot world whose server runs in database mode: the trunk seeded with an admin token of ``prod``."""
    admin: dict[str, str] = {}

    def backend(server) -> tuple[str, dict[str, str]]:  # type: ignore[no-untyped-def]
        assert requests.post(f"{server.url}/v1/api/tenants", json={"slug": "acme"}, headers=CTL, timeout=10).ok
        made = requests.post(f"{server.url}/v1/api/tenants/acme/tokens", headers=CTL, timeout=10,
                             json={"name": "admin", "environment": "prod"})
        assert made.status_code == 201, made.text
        body = made.json()
        admin.update(secret=body["token_secret"], scope=f"{body['workspace_id']}/{body['environment_id']}",
                     workspace=body["workspace_id"], database=server.settings.database_url)
        return (f"{server.url}/v1/states/{admin['scope']}/infra",
                {"TF_HTTP_USERNAME": body["workspace_id"], "TF_HTTP_PASSWORD": body["token_secret"]})

    w = world_factory(kilolock_yml=KILOLOCK_YML, backend=backend,
                      server_settings={"auth_mode": AuthMode.DATABASE, "control_token": CONTROL})
    return w, admin, f"{w.server_url}/v1/engine/states/{admin['scope']}/infra"


@pytest.mark.terraform
def test_the_bot_applies_a_project_with_its_owners_scoped_token_and_the_server_refuses_outside_it(
        world_factory, tmp_path: Path, caplog):  # noqa: F811
    w, admin, state = database_world(world_factory)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KL_DATABASE_URL": admin["database"]}
    missing = kl("tokens", "create", "acme", "--name", "bot-x", "--environment", "prod", "--scopes-from-owners",
                 "nope", "--checkout", str(w.work / ".kilolock.yml"), env=env, cwd=tmp_path)
    assert missing.returncode != 0 and "has no project 'nope' (its projects: infra)" in missing.stderr
    made = kl("tokens", "create", "acme", "--name", "bot-infra", "--environment", "prod", "--scopes-from-owners",
              "infra", "--json", env=env, cwd=w.work)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    # The top-level rule and the project's own; the unowned rule grants nothing; reads everywhere.
    assert sorted(created["token"]["scopes"]) == sorted(["terraform_data.net:write", *(f"{g}:write" for g in DB),
                                                         "*:read"])
    secret = created["token_secret"]
    # The fallback token has the whole state: the project's own token is what bounds the bot here.
    w.settings = replace(w.settings, bot_token=admin["secret"],
                         bot_project_tokens=(BotProjectToken(REPO.upper(), "infra", secret),))
    jobs.configure(w.settings, github=fast_github)
    caplog.set_level(logging.INFO)

    def serial() -> int:
        got = requests.get(f"{state}/resources", headers={"Authorization": f"Bearer {admin['secret']}"}, timeout=10)
        assert got.ok, got.text
        return int(got.json()["serial"])

    inside = FILES["db.tf"].replace("db-v1", "db-v2")
    w.open_pr(1, "db-v2", {"db.tf": inside})
    w.run_jobs()
    merged = w.merge(1)
    w.run_jobs()
    [check] = w.sim.runs("kilolock/apply", sha=merged)
    assert check["conclusion"] == "success", check["output"]["summary"]
    assert serial() == 2

    w.open_pr(2, "queue-v2", {"queue.tf": FILES["queue.tf"].replace("queue-v1", "queue-v2")})
    w.run_jobs()
    merged = w.merge(2)
    w.run_jobs()
    [check] = w.sim.runs("kilolock/apply", sha=merged)
    assert check["conclusion"] == "failure", check["output"]
    body = w.sim.bot_comment(2)
    assert "**Apply failed**" in body, body
    assert "address scopes do not allow reserving 'terraform_data.queue' (write)" in body, body
    assert serial() == 2  # nothing applied
    runs = requests.get(f"{w.server_url}/v1/engine/runs", params={"state": f"{admin['scope']}/infra"},
                        headers={"Authorization": f"Bearer {admin['secret']}"}, timeout=10).json()["runs"]
    assert [r["status"] for r in runs if "#2@" in r["actor"]] in ([], ["failed"]), runs

    # A comment apply inside the scopes commits with the project's token, and its hold is that token's.
    w.open_pr(3, "db-v3", {"db.tf": inside.replace("db-v2", "db-v3")})
    w.run_jobs()
    comment(w, 3, "kilolock apply")
    w.run_jobs()
    assert serial() == 3, replies(w, 3)
    [hold] = holds_of(w, 3)
    assert (hold.state_name, hold.token_name) == (f"{admin['scope']}/infra", "bot-infra"), hold
    live = requests.get(f"{w.server_url}/v1/engine/reservations", params={"state": f"{admin['scope']}/infra"},
                        headers={"Authorization": f"Bearer {admin['secret']}"}, timeout=10).json()["reservations"]
    assert {r["glob"] for r in live if r["run_id"] == hold.run_id} == set(hold.write_globs), live

    events = requests.get(f"{state}/events", headers={"Authorization": f"Bearer {admin['secret']}"},
                          timeout=10).json()["events"]
    # The refusal is audited under the project's token, naming the glob and the nearest scope.
    [refused] = [e for e in events if e["actor"] == "bot-infra" and e["detail"].get("glob") == "terraform_data.queue"]
    assert refused["detail"].get("nearest_scope") == "*:read", refused
    said = [str(c["body"]) for n in (1, 2, 3) for c in w.sim.pr_comments(n)]
    said += [json.dumps(r.get("output")) for r in w.sim.runs("kilolock/apply")]
    for secret_text in (secret, admin["secret"]):
        assert not any(secret_text in text for text in said)
        assert secret_text not in caplog.text
