"""The selections of a file-scoped change: the files of ``-f`` (with what each declared at HEAD) and those
``--changed-from`` finds changed since a git ref (with what they declared there), as an
``analyzer.scoping.Selection``. The change itself runs through ``runner.core.pipeline``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from analyzer.gitdiff import WidenKind
from analyzer.hcl import HclError, ParseCache
from analyzer.scoping import (
    ScopeRefused,
    Selection,
    file_readers,
    selection_from_changes,
)
from runner.core.config import read_configuration
from runner.core.errors import InvalidInput, NothingToDo
from runner.core.git import GitError, changed_from, text_at, work_tree_root
from runner.core.scope import module_sources
from runner.core.spec import is_plan_file

__all__ = ["ChangedSelection", "Selection", "changed_selection", "file_selection"]


@dataclass(frozen=True, slots=True)
class ChangedSelection:
    """What ``--changed-from`` chose, with the root module's files read to choose it: the plan takes them
    (``ChangeRequest.files``) instead of reading the configuration a second time."""

    selection: Selection
    files: Mapping[str, str]


def file_selection(config_dir: Path, files: Sequence[str]) -> Selection:
    """-f FILE…: the selected files, with the text each had at HEAD when the configuration is in a git work tree
    (what a selected file declared there and no file declares now is destroyed, its outputs removed, as a full
    apply would). Without git, or for a file new since HEAD, there is no earlier text to compare."""
    root = work_tree_root(config_dir)
    earlier: dict[str, str] = {}
    if root is None:
        return Selection(tuple(files), earlier)
    for name in files:
        try:
            earlier[f"{name}@HEAD"] = text_at(root, "HEAD", (config_dir.resolve() / name).relative_to(root).as_posix())
        except (GitError, ValueError):
            continue  # new since HEAD, outside the work tree, or no commit yet: nothing declared before
    return Selection(tuple(files), earlier)


def changed_selection(config_dir: Path, ref: str, *, against: str | None = None,
                      files: Mapping[str, str] | None = None) -> ChangedSelection:
    """--changed-from REF: the selection for what changed since ``ref`` in the git repository holding
    ``config_dir`` — up to the working tree, or up to the commit ``against`` (the pull-request bot, on a
    checkout of that commit). What a still-present selected file declared at ``ref`` joins the deleted
    texts, so a block removed from it is planned for destruction. ``files`` are the root module's files when
    the caller has read them (read here otherwise). Raises runner.core.git.GitError, InvalidInput,
    NothingToDo (no Terraform file changed)."""
    texts = read_configuration(config_dir) if files is None else files
    cache = ParseCache()
    try:
        sources = module_sources(texts, cache)
    except HclError as exc:
        raise InvalidInput(f"{exc}: fix that file, or run kl plan without -f (a full plan)") from exc
    readers = file_readers(texts)
    scope = changed_from(config_dir, config_dir, ref, against=against, module_sources=sources,
                         file_readers=readers or {}, is_artifact=is_plan_file)
    var_texts: dict[str, tuple[str | None, str | None]] = {}
    for widening in scope.widen:
        if widening.kind is WidenKind.VARIABLES:
            try:
                old: str | None = text_at(config_dir, ref, widening.path)
            except GitError:
                old = None  # new since the ref
            now = config_dir / widening.names[0]
            if against is not None:
                try:
                    new: str | None = text_at(config_dir, against, widening.path)
                except GitError:
                    new = None
            else:
                new = now.read_text(encoding="utf-8", errors="surrogateescape") if now.is_file() else None
            var_texts[widening.path] = (old, new)
    try:
        chosen = selection_from_changes(scope, texts, cache, var_texts)
    except ScopeRefused as exc:
        raise (NothingToDo if exc.exit_code == 0 else InvalidInput)(str(exc)) from exc
    deleted = dict(chosen.deleted)
    for name in chosen.files:
        try:
            deleted[f"{name}@{ref}"] = text_at(config_dir, ref, posixpath.join(scope.config_dir, name))
        except GitError:
            continue  # new since the ref: nothing declared before
    return ChangedSelection(Selection(chosen.files, deleted, chosen.variables), texts)
