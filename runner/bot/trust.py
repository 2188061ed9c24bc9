"""Whose code the bot runs Terraform for: a pull request is *trusted* when its head lives in the
repository itself (not a fork) and its author has write permission there (GitHub's collaborator
permission, asked once per job). Untrusted pull requests get the footprint (HCL analysis, no Terraform)
but no plan preview and no comment apply, unless the operator opted the repository in to previews —
``KL_GITHUB_UNTRUSTED_PREVIEWS`` on the server, or ``untrusted_previews: true`` in the **default
branch's** ``.kilolock.yml`` (never the pull request's own) — and then the preview runs without any
credential (``runner.bot.flow.Workbench.without_credentials``).

Owns that decision and the words that explain it. Must not: read the pull request's files, or the
environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config import Settings
from app.domain.repositories import is_allowed
from runner.bot.config import BotConfig
from runner.bot.github import GitHub, PullInfo

WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})


@dataclass(frozen=True, slots=True)
class Trust:
    """Whether the pull request's code is trusted, and when not, why (a sentence for its comment)."""

    trusted: bool
    reason: str = ""


def of_pull_request(gh: GitHub, repo: str, pr: PullInfo) -> Trust:
    """Trusted: the head is in ``repo`` itself and the author may write to it."""
    if pr.head_repo is None or pr.head_repo.lower() != repo.lower():
        where = f"the fork {pr.head_repo}" if pr.head_repo else "a fork that no longer exists"
        return Trust(False, f"its commits come from {where}, not from {repo}")
    permission = gh.permission(pr.author)
    if permission not in WRITE_PERMISSIONS:
        return Trust(False, f"its author {pr.author} does not have write permission on {repo} (GitHub says "
                            f"{permission!r})")
    return Trust(True)


def previews_enabled(settings: Settings, repo: str, default_config: BotConfig | None) -> bool:
    """Whether the operator let untrusted pull requests of ``repo`` have (credential-free) previews."""
    return is_allowed(settings.github_untrusted_previews, repo) or bool(
        default_config is not None and default_config.untrusted_previews)


def preview_withheld(trust: Trust, branch: str) -> str:
    """Why no plan preview ran, and how an operator enables one."""
    return (f"Kilolock runs no Terraform for this pull request because {trust.reason}: pull requests from forks "
            "or by authors without write permission get no plan preview. A maintainer can review the change and "
            "push it to a branch of this repository, or an operator can enable credential-free previews for this "
            "repository (KL_GITHUB_UNTRUSTED_PREVIEWS on the server, or untrusted_previews: true in .kilolock.yml "
            f"on {branch}).")


def apply_refused(login: str, trust: Trust) -> str:
    return (f"@{login} Kilolock does not apply this pull request before merge because {trust.reason}. Review it "
            "and merge it (the merge is applied), or push its commits to a branch of this repository.")
