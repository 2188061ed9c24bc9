"""Webhook routing: which bot job a GitHub delivery asks for, and the stable id of that job.

``route`` reads the event name and the parsed payload and answers with frozen data (the jobs to
enqueue with their typed arguments and stable ids — ``app.domain.jobs`` — or why there are none); a
comment is a job only when ``app.domain.commands`` parses it as addressed to Kilolock. Pure: no I/O,
no clock, no GitHub API calls. The webhook view
(``app.web.webhook``) verifies, dedupes, calls ``route`` and enqueues; the routing table is in
docs/github.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.jsonfields import is_number, is_object, is_text, member
from app.domain import commands
from app.domain.jobs import (
    ClosedArgs,
    CommentArgs,
    JobArgs,
    MergeArgs,
    PullRequestArgs,
    PushArgs,
    RerunArgs,
    ReviewArgs,
    job_id,
)
from app.errors import BadRequestError

# The event/action pairs the bot acts on; everything else is acknowledged and ignored.
PR_UPDATED = frozenset({"opened", "reopened", "synchronize"})
REVIEW_CHANGED = frozenset({"submitted", "dismissed"})


class PayloadError(BadRequestError):
    """A signed delivery whose payload lacks a field the routing needs."""

    code = "bad_payload"


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job to enqueue: its typed arguments (their ``kind`` names the job) and its id."""

    args: JobArgs
    job_id: str

    @property
    def kind(self) -> str:
        return self.args.kind


@dataclass(frozen=True, slots=True)
class Routed:
    """What a delivery asks for. ``jobs`` is empty when it is ignored, and ``reason`` says why."""

    event: str
    action: str
    repo: str
    jobs: tuple[JobRequest, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Delivery:
    event: str
    action: str
    repo: str
    delivery_id: str
    app_id: str | None


def route(event: str, delivery_id: str, payload: Mapping[str, Any], *, app_id: str | None = None) -> Routed:
    """The jobs a verified delivery asks for. ``app_id`` (App mode) keeps ``check_run`` re-runs to
    our own check runs. Raises PayloadError when a handled event lacks a field it needs."""
    action = payload.get("action")
    action = action if isinstance(action, str) else ""
    repo = _optional_repo(payload)
    handler = _HANDLERS.get(event)
    if handler is None:
        return Routed(event, action, repo, reason=f"event {event!r} is not handled")
    return handler(_Delivery(event, action, repo, delivery_id, app_id), payload)


def _pull_request(d: _Delivery, payload: Mapping[str, Any]) -> Routed:
    if d.action not in PR_UPDATED and d.action != "closed":
        return Routed(d.event, d.action, d.repo, reason=f"pull_request action {d.action!r} is not handled")
    pr = _object(payload, "pull_request")
    number = _int(pr, "number", "pull_request")
    head_sha = _str(_object(pr, "head", "pull_request"), "sha", "pull_request.head")
    if d.action in PR_UPDATED:
        # A reopen can repeat an earlier head SHA; its own id makes the job recompute (and re-save
        # the footprint that the close dropped) instead of finding the earlier run's stored result.
        parts: tuple[str | int, ...] = (number, head_sha)
        if d.action == "reopened":
            parts += (d.delivery_id,)
        return _one(d, PullRequestArgs(d.repo, number, head_sha), parts)
    # Only `merged` says whether a close was a merge: merge_commit_sha is set on unmerged closes too.
    if pr.get("merged") is True:
        merge_sha = pr.get("merge_commit_sha")
        if not isinstance(merge_sha, str) or not merge_sha:
            raise PayloadError("pull_request.merged is true but pull_request.merge_commit_sha is missing")
        return _one(d, MergeArgs(d.repo, number, merge_sha), (number, merge_sha))
    return _one(d, ClosedArgs(d.repo, number), (number, d.delivery_id))


def _check_run(d: _Delivery, payload: Mapping[str, Any]) -> Routed:
    if d.action != "rerequested":
        return Routed(d.event, d.action, d.repo, reason=f"check_run action {d.action!r} is not handled")
    run = _object(payload, "check_run")
    owner_app = run.get("app")
    owner_id = owner_app.get("id") if isinstance(owner_app, Mapping) else None
    if d.app_id is not None and owner_id is not None and str(owner_id) != d.app_id:
        return Routed(d.event, d.action, d.repo, reason="the check run belongs to another GitHub App")
    external_id = run.get("external_id")
    if not isinstance(external_id, str) or not external_id:
        return Routed(d.event, d.action, d.repo, reason="the check run has no external_id: not a Kilolock check")
    head_sha = _str(run, "head_sha", "check_run")
    run_id = run.get("id", "")
    # Every re-run request is a new run of the job, so the delivery is part of the id.
    return _one(d, RerunArgs(d.repo, external_id, head_sha), (run_id, d.delivery_id))


def _push(d: _Delivery, payload: Mapping[str, Any]) -> Routed:
    ref = _str(payload, "ref", "push")
    default_branch = _str(_object(payload, "repository"), "default_branch", "repository")
    if ref != f"refs/heads/{default_branch}":
        return Routed(d.event, d.action, d.repo, reason=f"push to {ref}, not to the default branch {default_branch!r}")
    if payload.get("deleted") is True:
        return Routed(d.event, d.action, d.repo, reason="the push deleted the branch")
    after = _str(payload, "after", "push")
    before = _str(payload, "before", "push")
    # Whether the push is a PR's merge commit is decided by the job, which asks GitHub.
    return _one(d, PushArgs(d.repo, after, before), (after,))


def _issue_comment(d: _Delivery, payload: Mapping[str, Any]) -> Routed:
    if d.action != "created":
        return Routed(d.event, d.action, d.repo, reason=f"issue_comment action {d.action!r} is not handled")
    issue = _object(payload, "issue")
    if not issue.get("pull_request"):
        return Routed(d.event, d.action, d.repo, reason="a comment on an issue, not on a pull request")
    comment = _object(payload, "comment")
    body = comment.get("body")
    body = body if isinstance(body, str) else ""
    if commands.parse(body) is None:
        return Routed(d.event, d.action, d.repo,
                      reason=f"the comment does not start with {commands.COMMAND_WORD!r}")
    user = _object(comment, "user", "comment")
    if user.get("type") == "Bot":
        # Bots (this one included) never drive the bot: no reply loops.
        return Routed(d.event, d.action, d.repo, reason="the comment was written by a bot")
    number = _int(issue, "number", "issue")
    comment_id = _int(comment, "id", "comment")
    login = _str(user, "login", "comment.user")
    return _one(d, CommentArgs(d.repo, number, comment_id, login, body), (number, comment_id))


def _pull_request_review(d: _Delivery, payload: Mapping[str, Any]) -> Routed:
    if d.action not in REVIEW_CHANGED:
        return Routed(d.event, d.action, d.repo, reason=f"pull_request_review action {d.action!r} is not handled")
    pr = _object(payload, "pull_request")
    number = _int(pr, "number", "pull_request")
    head_sha = _str(_object(pr, "head", "pull_request"), "sha", "pull_request.head")
    # Every review is news for the apply requirements, so the delivery is part of the id.
    return _one(d, ReviewArgs(d.repo, number, head_sha), (number, head_sha, d.delivery_id))


def _ping(d: _Delivery, payload: Mapping[str, Any]) -> Routed:
    return Routed(d.event, d.action, d.repo, reason="ping: the webhook is set up")


def _one(d: _Delivery, args: JobArgs, parts: tuple[str | int, ...]) -> Routed:
    if not d.repo:
        raise PayloadError("repository.full_name is missing or not a string")
    return Routed(d.event, d.action, d.repo, jobs=(JobRequest(args, job_id(args.kind, d.repo, *parts)),))


_HANDLERS: dict[str, Callable[[_Delivery, Mapping[str, Any]], Routed]] = {
    "ping": _ping,
    "pull_request": _pull_request,
    "check_run": _check_run,
    "push": _push,
    "issue_comment": _issue_comment,
    "pull_request_review": _pull_request_review,
}


def _optional_repo(payload: Mapping[str, Any]) -> str:
    repository = payload.get("repository")
    name = repository.get("full_name") if isinstance(repository, Mapping) else None
    return name if isinstance(name, str) else ""


def _object(doc: Mapping[str, Any], key: str, where: str = "payload") -> Mapping[str, Any]:
    return member(doc, key, is_object, lambda: PayloadError(f"{where}.{key} is missing or not an object"))


def _str(doc: Mapping[str, Any], key: str, where: str) -> str:
    return member(doc, key, is_text, lambda: PayloadError(f"{where}.{key} is missing or not a string"))


def _int(doc: Mapping[str, Any], key: str, where: str) -> int:
    return member(doc, key, is_number, lambda: PayloadError(f"{where}.{key} is missing or not a number"))
