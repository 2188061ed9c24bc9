"""runner.bot.github against GitHub's REST API simulated with ``responses``: every call is asserted.

PyGithub sends requests to ``https://api.github.com:443/...`` (explicit port), so mocks are registered
with ``:443`` while URLs inside JSON bodies stay as GitHub writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
import responses
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.config import Settings
from bench.webhooks import payload
from runner.bot.github import COMMENT_LIMIT, OUTPUT_LIMIT, GitHub, GitHubError, PullInfo, forget_cached_installations

API = "https://api.github.com"
MOCK = "https://api.github.com:443"
REPO = "octo-org/infra"
R = f"{MOCK}/repos/{REPO}"
SHA = "6dcb09b5b57875f334f61aebed695e2e4193db5e"
APP_ID = "12345"
SLUG = "kilolock-test"
BOT = f"{SLUG}[bot]"
MARKER = "<!-- kilolock:footprint -->"
TOKEN1 = "ghs_" + "A" * 36
TOKEN2 = "ghs_" + "B" * 36
PAT = "ghp_" + "C" * 36


@pytest.fixture(scope="session")
def private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def app_settings(private_key: rsa.RSAPrivateKey) -> Settings:
    pem = private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
    return Settings(github_app_id=APP_ID, github_private_key=pem, github_api_url=API)


@pytest.fixture
def token_settings() -> Settings:
    return Settings(github_token=PAT, github_api_url=API)


@pytest.fixture
def api() -> Iterator[responses.RequestsMock]:
    """The simulated API; every registered answer must be used, and the caches start empty."""
    forget_cached_installations()
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        yield mock
    forget_cached_installations()


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def calls(api: responses.RequestsMock) -> list[tuple[str, str]]:
    """(method, path and query) of every request made, in order."""
    found = []
    for call in api.calls:
        url = call.request.url.replace(MOCK, "")
        found.append((call.request.method, url))
    return found


def sent_json(api: responses.RequestsMock, index: int) -> dict[str, Any]:
    body = api.calls[index].request.body
    doc: dict[str, Any] = json.loads(body)
    return doc


def auth_header(api: responses.RequestsMock, index: int) -> str:
    return str(api.calls[index].request.headers["Authorization"])


def installed(api: responses.RequestsMock, *, expires_in: timedelta = timedelta(hours=1),
              tokens: tuple[str, ...] = (TOKEN1,)) -> None:
    api.add(responses.GET, f"{R}/installation", json={"id": 777, "app_id": int(APP_ID), "app_slug": SLUG,
                                                      "account": {"login": "octo-org"}})
    for token in tokens:
        expires = (datetime.now(UTC) + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ")
        api.add(responses.POST, f"{MOCK}/app/installations/777/access_tokens", status=201,
                json={"token": token, "expires_at": expires, "permissions": {"checks": "write"}})


def app_client(settings: Settings, sleeps: Sleeps) -> GitHub:
    return GitHub.for_repo(settings, REPO, sleep=sleeps, throttle=False)


def comment(id_: int, login: str, body: str) -> dict[str, Any]:
    return {"id": id_, "body": body, "user": {"login": login, "id": id_ * 10, "type": "Bot" if "[bot]" in login
                                              else "User"},
            "url": f"{API}/repos/{REPO}/issues/comments/{id_}",
            "html_url": f"https://github.com/{REPO}/pull/2#issuecomment-{id_}"}


def check_run(id_: int, *, status: str = "in_progress", app_id: int = int(APP_ID), name: str = "kilolock/plan"
              ) -> dict[str, Any]:
    return {"id": id_, "name": name, "head_sha": SHA, "status": status, "external_id": "job-1",
            "conclusion": None if status != "completed" else "success", "url": f"{API}/repos/{REPO}/check-runs/{id_}",
            "app": {"id": app_id, "slug": SLUG if app_id == int(APP_ID) else "other-ci"}}


CHECKS_QUERY = f"/repos/{REPO}/commits/{SHA}/check-runs?check_name=kilolock%2Fplan&filter=latest&per_page=100"


# --- App authentication -------------------------------------------------------------------------


def test_app_mode_signs_a_jwt_finds_the_installation_and_uses_its_token(api, app_settings, private_key, sleeps):
    installed(api)
    pr = payload("pull_request/opened")["pull_request"]
    api.add(responses.GET, f"{R}/pulls/2", json=pr)

    gh = app_client(app_settings, sleeps)
    info = gh.pull_request(2)

    assert (gh.mode, gh.login) == ("app", BOT)
    assert info == PullInfo(number=2, head_sha=pr["head"]["sha"], head_ref="changes", base_ref="master",
                            base_sha=pr["base"]["sha"], merged=False, state="open", author="Codertocat")
    assert calls(api) == [("GET", f"/repos/{REPO}/installation"),
                          ("POST", "/app/installations/777/access_tokens"),
                          ("GET", f"/repos/{REPO}/pulls/2")]
    for index in (0, 1):
        scheme, token = auth_header(api, index).split(" ", 1)
        claims = jwt.decode(token, private_key.public_key(), algorithms=["RS256"])
        assert scheme == "Bearer" and claims["iss"] == APP_ID
        assert 0 < claims["exp"] - claims["iat"] <= 600
    assert auth_header(api, 2) == f"token {TOKEN1}"
    assert gh.clone_token() == TOKEN1
    assert sleeps == []


def test_the_installation_and_its_token_are_reused_by_the_next_client(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}", json={"full_name": REPO, "default_branch": "main", "url": f"{API}/repos/{REPO}"})
    api.add(responses.GET, f"{R}/collaborators/alice/permission", json={"permission": "write"})

    assert app_client(app_settings, sleeps).default_branch() == "main"
    assert app_client(app_settings, sleeps).has_write_access("alice") is True

    assert [c for c in calls(api) if "installation" in c[1]] == [
        ("GET", f"/repos/{REPO}/installation"), ("POST", "/app/installations/777/access_tokens")]


def test_a_token_close_to_expiry_is_refreshed_before_use(api, app_settings, sleeps):
    installed(api, expires_in=timedelta(minutes=2), tokens=(TOKEN1, TOKEN2))
    pr = payload("pull_request/opened")["pull_request"]
    api.add(responses.GET, f"{R}/pulls/2", json=pr)

    gh = app_client(app_settings, sleeps)
    gh.pull_request(2)
    gh.pull_request(2)

    assert calls(api) == [("GET", f"/repos/{REPO}/installation"),
                          ("POST", "/app/installations/777/access_tokens"),
                          ("GET", f"/repos/{REPO}/pulls/2"),
                          ("POST", "/app/installations/777/access_tokens"),
                          ("GET", f"/repos/{REPO}/pulls/2")]
    assert auth_header(api, 2) == f"token {TOKEN1}"
    assert auth_header(api, 4) == f"token {TOKEN2}"


def test_the_apps_slug_is_read_from_the_app_when_the_installation_omits_it(api, app_settings, sleeps):
    api.add(responses.GET, f"{R}/installation", json={"id": 778, "app_id": int(APP_ID)})
    api.add(responses.GET, f"{MOCK}/app", json={"id": int(APP_ID), "slug": "kilolock-ghes", "name": "Kilolock"})

    assert app_client(app_settings, sleeps).login == "kilolock-ghes[bot]"
    assert calls(api) == [("GET", f"/repos/{REPO}/installation"), ("GET", "/app")]


def test_an_app_not_installed_on_the_repository_is_a_clear_error(api, app_settings, sleeps):
    api.add(responses.GET, f"{R}/installation", status=404, json={"message": "Not Found"})

    with pytest.raises(GitHubError, match="not installed on octo-org/infra") as caught:
        app_client(app_settings, sleeps)
    assert caught.value.status == 404


def test_no_credentials_is_a_configuration_error():
    with pytest.raises(GitHubError, match="KL_GITHUB_APP_ID and KL_GITHUB_PRIVATE_KEY"):
        GitHub.for_repo(Settings(), REPO)


def test_token_mode_uses_the_tokens_user_as_login(api, token_settings, sleeps):
    api.add(responses.GET, f"{MOCK}/user", json={"login": "octo-bot", "id": 1})

    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)

    assert (gh.mode, gh.login, gh.login, gh.clone_token()) == ("token", "octo-bot", "octo-bot", PAT)
    assert calls(api) == [("GET", "/user")]
    assert auth_header(api, 0) == f"token {PAT}"


def test_a_custom_api_url_is_used_for_every_call(api, token_settings, sleeps):
    ghes = "https://ghe.example.test/api/v3"
    api.add(responses.GET, f"https://ghe.example.test:443/api/v3/repos/{REPO}/collaborators/bob/permission",
            json={"permission": "read"})

    gh = GitHub.for_repo(Settings(github_token=PAT, github_api_url=ghes), REPO, sleep=sleeps, throttle=False)

    assert gh.has_write_access("bob") is False


# --- comments -----------------------------------------------------------------------------------


def test_upsert_comment_creates_one_when_only_someone_elses_carries_the_marker(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/issues/2/comments",
            json=[comment(5, "mallory", f"{MARKER}\nlooks like the bot"), comment(6, BOT, "another bot note")])
    api.add(responses.POST, f"{R}/issues/2/comments", status=201, json=comment(11, BOT, f"{MARKER}\nhello"))

    assert app_client(app_settings, sleeps).upsert_comment(2, MARKER, "hello") == 11

    assert calls(api)[2:] == [("GET", f"/repos/{REPO}/issues/2/comments?per_page=100"),
                              ("POST", f"/repos/{REPO}/issues/2/comments")]
    assert sent_json(api, 3) == {"body": f"{MARKER}\nhello"}


def test_upsert_comment_edits_the_bots_own_comment_in_place(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/issues/2/comments",
            json=[comment(5, "mallory", MARKER), comment(9, BOT, f"{MARKER}\nold")])
    api.add(responses.PATCH, f"{R}/issues/comments/9", json=comment(9, BOT, f"{MARKER}\nnew"))

    assert app_client(app_settings, sleeps).upsert_comment(2, MARKER, f"{MARKER}\nnew") == 9

    assert calls(api)[2:] == [("GET", f"/repos/{REPO}/issues/2/comments?per_page=100"),
                              ("PATCH", f"/repos/{REPO}/issues/comments/9")]
    assert sent_json(api, 3) == {"body": f"{MARKER}\nnew"}


def test_upsert_comment_with_an_unchanged_body_writes_nothing(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/issues/2/comments", json=[comment(9, BOT, f"{MARKER}\nsame")])

    assert app_client(app_settings, sleeps).upsert_comment(2, MARKER, f"{MARKER}\nsame") == 9
    assert [m for m, _ in calls(api)[2:]] == ["GET"]


def test_a_lost_answer_to_the_create_is_retried_without_a_duplicate_comment(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/issues/2/comments", json=[])
    api.add(responses.POST, f"{R}/issues/2/comments", status=502, json={"message": "Server Error"})
    # GitHub did create it before the 502: the retry finds it instead of posting again.
    api.add(responses.GET, f"{R}/issues/2/comments", json=[comment(12, BOT, f"{MARKER}\nresult")])

    assert app_client(app_settings, sleeps).upsert_comment(2, MARKER, "result") == 12

    assert [m for m, _ in calls(api)[2:]] == ["GET", "POST", "GET"]
    assert sleeps == [1.0]


def test_a_server_error_is_retried_until_the_comment_is_created_once(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/issues/2/comments", status=503, json={"message": "unavailable"})
    api.add(responses.GET, f"{R}/issues/2/comments", status=500, json={"message": "oops"})
    api.add(responses.GET, f"{R}/issues/2/comments", json=[])
    api.add(responses.POST, f"{R}/issues/2/comments", status=201, json=comment(13, BOT, f"{MARKER}\nx"))

    assert app_client(app_settings, sleeps).upsert_comment(2, MARKER, "x") == 13
    assert [m for m, _ in calls(api)[2:]] == ["GET", "GET", "GET", "POST"]
    assert sleeps == [1.0, 2.0]


def test_a_rate_limit_with_retry_after_is_waited_out_then_the_comment_is_created_once(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/issues/2/comments", json=[])
    api.add(responses.POST, f"{R}/issues/2/comments", status=403, headers={"Retry-After": "7"},
            json={"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
                             "again.", "documentation_url": "https://docs.github.com/rest"})
    api.add(responses.GET, f"{R}/issues/2/comments", json=[])
    api.add(responses.POST, f"{R}/issues/2/comments", status=201, json=comment(14, BOT, f"{MARKER}\nx"))

    assert app_client(app_settings, sleeps).upsert_comment(2, MARKER, "x") == 14
    assert [m for m, _ in calls(api)[2:]] == ["GET", "POST", "GET", "POST"]
    assert sleeps == [7.0]


def test_a_primary_rate_limit_waits_until_the_reset(api, app_settings, sleeps):
    installed(api)
    reset = int(datetime.now(UTC).timestamp()) + 20
    api.add(responses.GET, f"{R}/pulls/2", status=403,
            headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset), "X-RateLimit-Limit": "5000"},
            json={"message": "API rate limit exceeded for installation ID 777."})
    api.add(responses.GET, f"{R}/pulls/2", json=payload("pull_request/opened")["pull_request"])

    assert app_client(app_settings, sleeps).pull_request(2).number == 2
    [waited] = sleeps
    assert 15 <= waited <= 22


def test_a_rate_limit_beyond_the_wait_budget_fails_without_waiting(api, token_settings, sleeps):
    api.add(responses.GET, f"{R}/pulls/2", status=429, headers={"Retry-After": "3600"},
            json={"message": "rate limited"})

    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)
    with pytest.raises(GitHubError, match="rate limited") as caught:
        gh.pull_request(2)
    assert caught.value.status == 429
    assert sleeps == []


def test_persistent_server_errors_give_up_after_five_attempts(api, token_settings, sleeps):
    api.add(responses.GET, f"{R}/pulls/2", status=502, json={"message": "bad gateway"})

    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)
    with pytest.raises(GitHubError, match="HTTP 502 after 5 attempts") as caught:
        gh.pull_request(2)
    assert caught.value.status == 502
    assert sleeps == [1.0, 2.0, 4.0, 8.0]
    assert len(api.calls) == 5


def test_client_errors_are_not_retried_and_never_show_a_token(api, token_settings, sleeps):
    api.add(responses.GET, f"{R}/pulls/2", status=401, json={"message": f"Bad credentials {PAT} ghs_{'Z' * 36}"})

    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)
    with pytest.raises(GitHubError) as caught:
        gh.pull_request(2)
    assert caught.value.status == 401
    assert PAT not in str(caught.value) and "ghs_" not in str(caught.value) and "[redacted]" in str(caught.value)
    assert sleeps == [] and len(api.calls) == 1


def test_a_huge_comment_is_truncated_below_githubs_limit_and_keeps_its_marker(api, token_settings, sleeps):
    api.add(responses.GET, f"{R}/issues/2/comments", json=[comment(3, "alice", "LGTM")])
    api.add(responses.GET, f"{MOCK}/user", json={"login": "octo-bot"})
    api.add(responses.POST, f"{R}/issues/2/comments", status=201, json=comment(15, "octo-bot", MARKER))

    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)
    gh.upsert_comment(2, MARKER, "é" * 70_000 + MARKER)

    assert [m for m, _ in calls(api)] == ["GET", "GET", "POST"]
    sent = sent_json(api, 2)["body"]
    assert len(sent.encode()) <= COMMENT_LIMIT
    assert sent.startswith(MARKER) and "output truncated" in sent


def test_reply_posts_a_new_comment_and_a_lost_answer_does_not_duplicate_it(api, token_settings, sleeps):
    api.add(responses.GET, f"{MOCK}/user", json={"login": "octo-bot"})
    api.add(responses.POST, f"{R}/issues/2/comments", status=502, json={"message": "bad gateway"})
    api.add(responses.GET, f"{R}/issues/2/comments", json=[comment(16, "octo-bot", "Commands: kilolock plan")])

    GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False).reply(2, "Commands: kilolock plan")

    assert [m for m, _ in calls(api)] == ["POST", "GET", "GET"]
    assert calls(api)[1][1].startswith(f"/repos/{REPO}/issues/2/comments?") and "since=" in calls(api)[1][1]
    assert sleeps == [1.0]


# --- checks -------------------------------------------------------------------------------------


def test_a_check_run_is_created_then_updated_in_place(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{MOCK}{CHECKS_QUERY}", json={"total_count": 0, "check_runs": []})
    api.add(responses.POST, f"{R}/check-runs", status=201, json=check_run(4242))
    api.add(responses.GET, f"{MOCK}{CHECKS_QUERY}", json={"total_count": 1, "check_runs": [check_run(4242)]})
    api.add(responses.PATCH, f"{R}/check-runs/4242", json=check_run(4242, status="completed"))

    gh = app_client(app_settings, sleeps)
    gh.set_check(SHA, "kilolock/plan", status="in_progress", title="Planning", summary="2 projects",
                 external_id="job-1")
    gh.set_check(SHA, "kilolock/plan", status="completed", conclusion="success", title="1 to add",
                 summary="**1** to add", text="+ terraform_data.a", external_id="job-1")

    assert [m for m, _ in calls(api)[2:]] == ["GET", "POST", "GET", "PATCH"]
    assert sent_json(api, 3) == {"name": "kilolock/plan", "head_sha": SHA, "status": "in_progress",
                                 "external_id": "job-1", "output": {"title": "Planning", "summary": "2 projects"}}
    assert sent_json(api, 5) == {"status": "completed", "conclusion": "success", "external_id": "job-1",
                                 "output": {"title": "1 to add", "summary": "**1** to add",
                                            "text": "+ terraform_data.a"}}


def test_another_apps_check_run_of_the_same_name_is_not_touched(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{MOCK}{CHECKS_QUERY}", json={"total_count": 1, "check_runs": [check_run(1, app_id=9)]})
    api.add(responses.POST, f"{R}/check-runs", status=201, json=check_run(4243))

    app_client(app_settings, sleeps).set_check(SHA, "kilolock/plan", status="queued")

    assert [m for m, _ in calls(api)[2:]] == ["GET", "POST"]
    assert sent_json(api, 3) == {"name": "kilolock/plan", "head_sha": SHA, "status": "queued"}


def test_a_new_run_on_a_completed_check_starts_a_fresh_check_run(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{MOCK}{CHECKS_QUERY}",
            json={"total_count": 1, "check_runs": [check_run(4242, status="completed")]})
    api.add(responses.POST, f"{R}/check-runs", status=201, json=check_run(4244))

    app_client(app_settings, sleeps).set_check(SHA, "kilolock/plan", status="in_progress", external_id="job-2")

    assert [m for m, _ in calls(api)[2:]] == ["GET", "POST"]
    assert sent_json(api, 3)["external_id"] == "job-2"


def test_check_run_outputs_are_truncated_below_githubs_limits(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{MOCK}{CHECKS_QUERY}", json={"total_count": 0, "check_runs": []})
    api.add(responses.POST, f"{R}/check-runs", status=201, json=check_run(4245, status="completed"))

    app_client(app_settings, sleeps).set_check(SHA, "kilolock/plan", status="completed", conclusion="failure",
                                               title="t" * 300, summary="s" * 70_000, text="ü" * 40_000)

    output = sent_json(api, 3)["output"]
    assert len(output["summary"].encode()) <= OUTPUT_LIMIT and len(output["text"].encode()) <= OUTPUT_LIMIT
    assert output["summary"].startswith("s" * 1000) and "output truncated" in output["summary"]
    assert output["text"].startswith("ü" * 1000) and "output truncated" in output["text"]
    assert len(output["title"]) <= 255


def test_token_mode_reports_commit_statuses_instead_of_check_runs(api, token_settings, sleeps):
    for _ in range(3):
        api.add(responses.POST, f"{R}/statuses/{SHA}", status=201, json={"id": 1, "state": "pending"})

    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)
    gh.set_check(SHA, "kilolock/plan", status="in_progress", title="Planning")
    gh.set_check(SHA, "kilolock/plan", status="completed", conclusion="failure", title="x" * 300)
    gh.set_check(SHA, "kilolock/plan", status="completed", conclusion="success", summary="all good\nmore")

    assert calls(api) == [("POST", f"/repos/{REPO}/statuses/{SHA}")] * 3
    assert sent_json(api, 0) == {"state": "pending", "description": "Planning", "context": "kilolock/plan"}
    failed = sent_json(api, 1)
    assert failed["state"] == "failure" and len(failed["description"]) == 140
    assert sent_json(api, 2) == {"state": "success", "description": "all good", "context": "kilolock/plan"}


def test_set_check_refuses_a_completed_status_without_a_conclusion(token_settings, sleeps):
    gh = GitHub.for_repo(token_settings, REPO, sleep=sleeps, throttle=False)
    with pytest.raises(ValueError, match="conclusion"):
        gh.set_check(SHA, "kilolock/plan", status="completed")


# --- permissions --------------------------------------------------------------------------------


@pytest.mark.parametrize("answer, allowed", [
    ({"permission": "admin", "role_name": "admin"}, True),
    ({"permission": "write", "role_name": "maintain"}, True),
    ({"permission": "write", "role_name": "write"}, True),
    ({"permission": "read", "role_name": "triage"}, False),
    ({"permission": "none"}, False),
])
def test_write_access_follows_the_collaborator_permission(api, app_settings, sleeps, answer, allowed):
    installed(api)
    api.add(responses.GET, f"{R}/collaborators/carol/permission", json={**answer, "user": {"login": "carol"}})

    assert app_client(app_settings, sleeps).has_write_access("carol") is allowed


def test_an_unknown_user_has_no_write_access(api, app_settings, sleeps):
    installed(api)
    api.add(responses.GET, f"{R}/collaborators/nobody/permission", status=404, json={"message": "Not Found"})

    assert app_client(app_settings, sleeps).has_write_access("nobody") is False
