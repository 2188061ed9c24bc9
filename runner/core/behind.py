"""A full ``kl plan`` from a checkout behind the trunk: which committed runs it would undo.

``kl apply`` records the git commit of the configuration it applied on the run (``info.git_commit``); the
server keeps the write globs the run held when it commits. A full plan that updates, replaces or deletes an
address under the write globs of a run whose commit the checkout does not contain is most likely taking
that change back: kl says so, naming the run, its serial, its actor and its commit. It is a warning only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.globs import Glob, GlobError, matches, parse_glob
from runner.core import git
from runner.core.engine_client import EngineClient

RECENT_RUNS = 200  # how many of the state's newest committed runs a plan compares against
SHOWN_ADDRESSES = 10  # addresses a warning names (and how many more)
UNDOING = frozenset({"update", "replace", "delete"})
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Behind:
    """A committed run the checkout lacks whose write globs cover addresses the plan changes."""

    run_id: str
    serial: int
    actor: str
    commit: str
    addresses: tuple[str, ...]

    @property
    def warning(self) -> str:
        shown = ", ".join(self.addresses[:SHOWN_ADDRESSES])
        more = len(self.addresses) - SHOWN_ADDRESSES
        return (f"this checkout lacks commit {self.commit[:12]}, applied by {self.actor} as run {self.run_id} "
                f"(serial {self.serial}); this plan would undo it at {shown}"
                + (f" and {more} more" if more > 0 else "")
                + ": pull or rebase the checkout onto the trunk and plan again")

    def document(self) -> dict[str, Any]:
        return {"warning": self.warning, "run_id": self.run_id, "serial": self.serial, "actor": self.actor,
                "git_commit": self.commit, "addresses": list(self.addresses)}


def config_commit(config_dir: Path) -> str | None:
    """The commit checked out where the configuration lives (``git rev-parse HEAD``), or None outside git."""
    root = git.work_tree_root(config_dir)
    if root is None:
        return None
    try:
        return git.resolve_commit(root, "HEAD")
    except git.GitError:
        return None  # a repository without commits yet


def behind_runs(client: EngineClient, state: str, config_dir: Path, actions: Mapping[str, str]) -> tuple[Behind, ...]:
    """The state's recent committed runs whose commit ``config_dir``'s checkout does not contain and whose
    write globs cover an address ``actions`` (address → what the plan does) updates, replaces or deletes.
    Outside git, or when nothing would be undone, none."""
    changed = sorted(a for a, action in actions.items() if action in UNDOING)
    root = git.work_tree_root(config_dir)
    head = config_commit(config_dir)
    if not changed or root is None or head is None:
        return ()
    found: list[Behind] = []
    for run in client.list_runs(state, status="committed", limit=RECENT_RUNS):
        info = run.get("info") or {}
        commit = info.get("git_commit")
        serial = run.get("committed_serial")
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit) or not isinstance(serial, int):
            continue
        hit = _covered(changed, info)
        if hit and not _contains(root, commit, head):
            found.append(Behind(str(run.get("id")), serial, str(run.get("actor")), commit, hit))
    return tuple(sorted(found, key=lambda b: b.serial))


def _covered(addresses: Sequence[str], info: Mapping[str, Any]) -> tuple[str, ...]:
    """The addresses a run's write globs cover. A glob kl cannot read, or globs the server left out of its
    answer, cover every address: warn rather than miss."""
    globs = info.get("write_globs")
    if not isinstance(globs, list):
        return ()
    parsed: list[Glob | None] = [None] if info.get("write_globs_more") else []
    for text in globs:
        try:
            parsed.append(parse_glob(text) if isinstance(text, str) else None)
        except GlobError:
            parsed.append(None)
    return tuple(a for a in addresses if any(g is None or _matches(g, a) for g in parsed))


def _matches(glob: Glob, address: str) -> bool:
    try:
        return matches(glob, address)
    except ValueError:
        return True


def _contains(root: Path, commit: str, head: str) -> bool:
    """Whether ``head`` descends from ``commit``; a commit the repository does not know is not contained."""
    try:
        return git.is_ancestor(root, commit, head)
    except git.GitError:
        return False
