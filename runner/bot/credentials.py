"""Which engine token the bot presents for one project: the only owner of that choice.

The operator's ``KL_BOT_PROJECT_TOKENS`` gives a project its own token (``owner/repo:project``), or every
project of a repository one (``owner/repo``); a project with neither presents ``KL_BOT_TOKEN``. Nothing a
pull request holds takes part: the repository is the job's, the project name the default branch's.
Every engine call (plans, applies, drift checks, ending runs) and every hold of a project goes through
:func:`engine_token`, so a project's token scoped to its owners' globs (``kl tokens create
--scopes-from-owners``) bounds what the bot may change there, whatever a pull request asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.config import Settings


@dataclass(frozen=True, slots=True)
class EngineToken:
    """The token for one project and where it came from (error messages name ``source``, never ``secret``)."""

    secret: str | None = field(repr=False)
    source: str


def engine_token(settings: Settings, repo: str, project: str) -> EngineToken:
    """The project's own entry, else its repository's, else ``KL_BOT_TOKEN`` (repository names without case)."""
    wanted = repo.lower()
    entries = {(e.repo.lower(), e.project): e for e in settings.bot_project_tokens}
    entry = entries.get((wanted, project)) or entries.get((wanted, "*"))
    if entry is not None:
        return EngineToken(entry.token, f"KL_BOT_PROJECT_TOKENS entry {entry.key!r}")
    return EngineToken(settings.bot_token, "KL_BOT_TOKEN")


def repository_tokens(settings: Settings, repo: str) -> tuple[EngineToken, ...]:
    """Every token the bot may present for some project of ``repo``: its entries, then ``KL_BOT_TOKEN`` (to
    find what one of them took when the project is not known, as a release by hold id)."""
    wanted = repo.lower()
    found = [EngineToken(e.token, f"KL_BOT_PROJECT_TOKENS entry {e.key!r}") for e in settings.bot_project_tokens
             if e.repo.lower() == wanted]
    return (*found, EngineToken(settings.bot_token, "KL_BOT_TOKEN"))
