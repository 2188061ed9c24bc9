"""Webhook test helpers: GitHub's published payloads, signing, and payloads built from them.

The files under tests/fixtures/webhooks/ are GitHub's examples byte for byte (see SOURCES.md there).
GitHub publishes no merged ``closed`` example and none for ``check_run``, ``issue_comment`` or
``pull_request_review`` in that folder, so ``merged_payload``, ``check_run_payload``,
``issue_comment_payload`` and ``review_payload`` build them here,
following the shapes in GitHub's webhook documentation, and are never saved as if GitHub sent them.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import uuid
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "webhooks"
SECRET = "It's a Secret to Everybody"
REPO = "Codertocat/Hello-World"
HEAD_SHA = "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
MERGE_SHA = "c4295bd74fb0f4fda03689c3df3f2803b658fd85"


def raw(name: str) -> bytes:
    """A fixture's exact bytes: ``raw("pull_request/opened")``, ``raw("ping")``."""
    path = FIXTURES / f"{name}.payload.json" if "/" in name else FIXTURES / name / "payload.json"
    return path.read_bytes()


def payload(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(raw(name))
    return doc


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def headers(event: str, body: bytes, *, delivery: str | None = None, secret: str | None = SECRET) -> dict[str, str]:
    found = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
             "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/test"}
    if secret is not None:
        found["X-Hub-Signature-256"] = sign(body, secret)
    return found


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def merged_payload() -> dict[str, Any]:
    """``pull_request/closed`` as a merge: ``merged`` true, with ``merged_at`` and ``merged_by``."""
    doc = payload("pull_request/closed")
    pr = doc["pull_request"]
    pr["merged"] = True
    pr["merged_at"] = pr["closed_at"]
    pr["merged_by"] = copy.deepcopy(doc["sender"])
    return doc


def check_run_payload(*, external_id: str = "pull_request-Codertocat_Hello-World-2-abc-1234",
                      app_id: int = 12345, action: str = "rerequested") -> dict[str, Any]:
    """A ``check_run`` event on the fixture repository; its ``pull_requests`` is empty, as GitHub
    sends it for runs on commits of forks and sometimes for others."""
    base = payload("pull_request/opened")
    return {
        "action": action,
        "check_run": {
            "id": 4242, "name": "kilolock/footprint", "head_sha": HEAD_SHA, "external_id": external_id,
            "status": "completed", "conclusion": "failure", "pull_requests": [],
            "app": {"id": app_id, "slug": "kilolock-test", "name": "Kilolock (test)"},
            "check_suite": {"id": 99, "head_branch": "changes", "head_sha": HEAD_SHA},
        },
        "repository": base["repository"],
        "sender": base["sender"],
        "installation": base["installation"],
    }


def issue_comment_payload(body: str, *, on_pull_request: bool = True, user_type: str = "User",
                          login: str = "Codertocat", comment_id: int = 5551, action: str = "created") -> dict[str, Any]:
    """An ``issue_comment`` event on PR #2 of the fixture repository (or on a plain issue)."""
    base = payload("pull_request/opened")
    pr = base["pull_request"]
    issue: dict[str, Any] = {"number": 2, "title": pr["title"], "state": "open", "user": pr["user"],
                             "url": pr["issue_url"]}
    if on_pull_request:
        issue["pull_request"] = {"url": pr["url"], "html_url": pr["html_url"], "diff_url": pr["diff_url"],
                                 "patch_url": pr["patch_url"]}
    user = {**base["sender"], "login": login, "type": user_type}
    return {
        "action": action,
        "issue": issue,
        "comment": {"id": comment_id, "body": body, "user": user, "created_at": "2019-05-15T15:20:40Z"},
        "repository": base["repository"],
        "sender": user,
        "installation": base["installation"],
    }


def review_payload(*, state: str = "approved", login: str = "bob", action: str = "submitted",
                   review_id: int = 80) -> dict[str, Any]:
    """A ``pull_request_review`` event on the fixture's PR: ``review`` (state in lower case, as the event
    sends it, with ``commit_id``) next to the ``pull_request`` object of ``pull_request/opened``."""
    base = payload("pull_request/opened")
    pr = base["pull_request"]
    user = {**base["sender"], "login": login, "type": "User"}
    return {
        "action": action,
        "review": {"id": review_id, "user": user, "body": None, "state": state, "commit_id": pr["head"]["sha"],
                   "submitted_at": "2019-05-15T15:20:38Z", "html_url": pr["html_url"],
                   "pull_request_url": pr["url"], "author_association": "COLLABORATOR"},
        "pull_request": pr,
        "repository": base["repository"],
        "sender": user,
        "installation": base["installation"],
    }
