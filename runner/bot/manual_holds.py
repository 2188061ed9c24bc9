"""The pull-request comments ``kilolock hold GLOB… --reason TEXT [-p NAME] [--until DURATION]`` and
``kilolock release HOLD``: manual holds (app.store.manual_holds) taken and released from a pull request by
someone with write access, on the state of a project of the default branch's ``.kilolock.yml``.

The hold belongs to the bot's credential (so any writer of the repository may release it from a comment)
and names the commenter and the pull request as its owner. A hold without expiry is not offered here.

Must not: decide who may comment (``runner.bot.pulls`` checks write access first) or the bounds (the server's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from app.domain.commands import HoldArgs
from app.domain.manual_holds import check_reason
from app.errors import HoldNotFoundError, KlError
from app.store import manual_holds
from runner.bot import flow, markdown
from runner.bot.github import GitHub
from runner.bot.pr_holds import bot_principal, bot_principals
from runner.bot.results import CommentResult

if TYPE_CHECKING:
    from runner.bot.context import Context


def comment_hold(ctx: Context, gh: GitHub, repo: str, number: int, login: str, args: HoldArgs) -> CommentResult:
    who = markdown.mention(login)
    if args.problem:
        return CommentResult(reply=f"{who} {markdown.prose(args.problem)}", command="hold")
    if len(args.globs) > ctx.settings.max_globs_per_request:
        return CommentResult(reply=f"{who} a hold names at most {ctx.settings.max_globs_per_request} globs.",
                             command="hold")
    pr = gh.pull_request(number)
    branch = gh.default_branch()
    token = gh.clone_token()
    with flow.checkout(ctx.workbench, repo, pr.base_sha, token, refresh=True) as root:
        _, config, problems = flow.default_config(ctx.workbench, repo, root, branch, token)
    if config is None:
        shown = "; ".join(problems[:3])
        return CommentResult(reply=f"{who} .kilolock.yml on {markdown.prose(branch)} is not valid: "
                                   f"{markdown.prose(shown)}", command="hold")
    names = [p.name for p in config.projects]
    chosen = args.project or (names[0] if len(names) == 1 else None)
    project = config.project(chosen) if chosen else None
    if project is None:
        known = ", ".join(markdown.code(n) for n in names) or "none"
        return CommentResult(reply=f"{who} name the project to hold with -p NAME (projects: {known}).",
                             command="hold")
    principal = replace(bot_principal(ctx.settings, ctx.db, repo, project.name), actor=f"@{login} on {repo}#{number}")
    try:
        hold = manual_holds.take(ctx.db, principal, project.state, globs=args.globs, reason=check_reason(args.reason),
                                 policy=ctx.settings.hold_policy, until_seconds=args.until_seconds,
                                 until_released=False, max_globs=ctx.settings.max_globs_per_run)
    except KlError as exc:
        return CommentResult(reply=f"{who} the hold was not taken:\n\n{markdown.block(exc.message)}", command="hold")
    until = hold.until.isoformat(timespec="seconds") if hold.until else "until released"
    globs = ", ".join(markdown.code(g) for g in hold.globs)
    return CommentResult(reply=(f"{who} holds {globs} on state {markdown.code(hold.state)} "
                                f"(project {markdown.code(project.name)}) until {until}: "
                                f"{markdown.prose(hold.reason)}\n\nEvery apply that meets it is refused, naming "
                                f"this hold. Release it with {markdown.code('kilolock release ' + hold.id)} or "
                                f"{markdown.code('kl release ' + hold.id)}."), command="hold")


def comment_release(ctx: Context, repo: str, number: int, login: str, args: HoldArgs) -> CommentResult:
    who = markdown.mention(login)
    if args.problem:
        return CommentResult(reply=f"{who} {markdown.prose(args.problem)}", command="release")
    # The hold names no project: each environment the repository's tokens reach is asked in turn.
    principals = bot_principals(ctx.settings, ctx.db, repo)
    for index, holder in enumerate(principals):
        try:
            hold = manual_holds.release(ctx.db, replace(holder, actor=f"@{login} on {repo}#{number}"), args.hold_id)
            break
        except HoldNotFoundError as exc:
            if index == len(principals) - 1:
                return CommentResult(reply=f"{who} {markdown.prose(exc.message)}", command="release")
        except KlError as exc:
            return CommentResult(reply=f"{who} {markdown.prose(exc.message)}", command="release")
    return CommentResult(reply=(f"{who} released hold {markdown.code(hold.id)} on state {markdown.code(hold.state)} "
                                f"({', '.join(markdown.code(g) for g in hold.globs)}, held by "
                                f"{markdown.prose(hold.holder)})."), command="release")
