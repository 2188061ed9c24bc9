"""What changed since a git ref, as the scope of a file-scoped plan (``kl plan --changed-from REF``).

Owns the mapping from already-collected diff entries (repository-relative paths, as git prints them)
to a :class:`ChangeScope`: the ``.tf`` files to pass as repeated ``-f``, the deleted files whose text at
REF must still be analysed, the non-``.tf`` changes that widen the scope (to a module call, to the files
that read a template, or to a full plan), the changes that cannot be mapped safely, and the changes that
do not touch the configuration at all. The same mapping serves the pull-request bot, whose entries come
from ``merge-base...head``.

Must not: run git, read files or the environment, or parse HCL. ``runner.core.git`` collects the entries and
the texts at REF; the HCL analysis supplies the local module sources and the ``file()`` readers. When a
change cannot be placed with certainty the scope widens or records a failure: it never narrows silently
(see docs/file-scoped.md).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Change(StrEnum):
    """The kinds of change a :class:`DiffEntry` can carry (git's status letters A, M, D, R, C, T, U)."""

    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"
    RENAMED = "renamed"
    COPIED = "copied"
    TYPE_CHANGED = "type_changed"
    UNMERGED = "unmerged"


@dataclass(frozen=True, slots=True)
class DiffEntry:
    """One changed path between REF and the compared side, repository-relative with ``/`` separators.

    ``old_path`` is set for renames and copies. ``similarity`` is git's similarity index (0-100) for
    renames and copies; 100 means the content is identical, ``None`` means unknown (treated as edited).
    """

    change: str
    path: str
    old_path: str | None = None
    similarity: int | None = None


@dataclass(frozen=True, slots=True)
class DeletedFile:
    """A ``.tf`` file gone from the configuration, with its text at REF (path relative to the config dir)."""

    path: str
    text_at_ref: str


class WidenKind(StrEnum):
    """What a :class:`Widening` adds to the scope."""

    FULL = "full"            # only a full plan is safe
    MODULE = "module"        # the module calls ``names`` (their whole footprint ``module.NAME.*``)
    FILES = "files"          # the config-dir files ``names``, also added to ChangeScope.files
    VARIABLES = "variables"  # the variable-definitions file ``names[0]`` (config-dir relative) changed values


@dataclass(frozen=True, slots=True)
class Widening:
    """A change that widens the scope beyond the changed ``.tf`` files.

    ``path`` is repository-relative (it may lie outside the config dir); ``kind`` and ``names`` say what it
    adds. ``effect`` is the same as text (``full``, ``module:NAME``, ``files:a.tf,b.tf``, ``variables:F``).
    """

    path: str
    reason: str
    kind: WidenKind
    names: tuple[str, ...] = ()

    @property
    def effect(self) -> str:
        return self.kind.value if self.kind is WidenKind.FULL else f"{self.kind.value}:{','.join(self.names)}"


FULL: Final = "full"


@dataclass(frozen=True, slots=True)
class ChangeScope:
    """The files a file-scoped plan must cover for a set of changes.

    ``deleted`` also holds the old text of a ``.tf`` file renamed *with* edits, so that blocks removed in
    the edit are not forgotten: whoever analyses it must plan for destruction only the addresses that no
    remaining file declares.
    """

    config_dir: str
    files: tuple[str, ...]
    deleted: tuple[DeletedFile, ...]
    widen: tuple[Widening, ...]
    failures: tuple[str, ...]
    unrelated: tuple[str, ...]

    @property
    def needs_full_plan(self) -> bool:
        """Whether some change can only be planned safely over the whole configuration."""
        return any(w.kind is WidenKind.FULL for w in self.widen)

    @property
    def has_failures(self) -> bool:
        return bool(self.failures)


_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})
_NO_READERS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({})

_CONFIG_SUFFIXES = (".tf", ".tf.json")
_VARS_SUFFIXES = (".tfvars", ".tfvars.json")  # also covers *.auto.tfvars and *.auto.tfvars.json
# Terraform (not the configuration) writes these; they never feed a plan's configuration.
_STATE_SUFFIXES = (".tfstate", ".tfstate.backup")
_STATE_NAMES = frozenset({".terraform.tfstate.lock.info"})
_LOCK_FILE = ".terraform.lock.hcl"


def scope_changes(
    entries: Sequence[DiffEntry],
    *,
    config_dir: str,
    texts_at_ref: Mapping[str, str],
    module_sources: Mapping[str, str] = _EMPTY,
    file_readers: Mapping[str, tuple[str, ...]] = _NO_READERS,
    artifacts: frozenset[str] = frozenset(),
) -> ChangeScope:
    """Map diff entries to the scope of a file-scoped plan of the root module in ``config_dir``.

    ``config_dir`` is repository-relative (``""`` for the repository root). ``texts_at_ref`` maps the
    repository-relative path of a removed ``.tf`` file to its text at REF. ``module_sources`` maps each
    module call whose source is local (including calls nested in local modules, resolved by the caller to
    the root call that contains them) to its config-dir-relative source directory, e.g.
    ``{"web": "modules/web"}``. ``file_readers`` maps a config-dir-relative path read by ``file()`` or
    ``templatefile()`` to the ``.tf`` files whose expressions read it. ``artifacts`` holds the
    repository-relative paths the caller recognised by their content as Kilolock's own files (plan files).

    The rules, in the order they are tried for each changed path:

    1. Anything under a ``.terraform/`` directory, Terraform's state files (``*.tfstate``,
       ``*.tfstate.backup``, ``.terraform.tfstate.lock.info``), editor backups (``name~``, ``#name#``)
       and ``.tf`` files whose name starts with ``.`` (Terraform skips them): unrelated. So is one of
       Kilolock's own ``artifacts`` (a plan file is never configuration), unless a local module's directory
       holds it or ``file()``/``templatefile()`` reads it: then rules 5 and 6 apply to it as to any file.
    2. A ``.tf`` or ``.tf.json`` file directly in ``config_dir``: added, modified or copied → ``files``;
       deleted → ``deleted`` with its text at REF (its addresses must be planned for destruction, not
       forgotten; a missing text is a failure); renamed within ``config_dir`` → the new path in ``files``,
       and nothing deleted when the content is identical (the same blocks now live in the new file) or
       the old text in ``deleted`` when it was edited too. A rename into or out of ``config_dir`` counts
       as an addition or a deletion on that side; the other side goes through these rules on its own.
       Override files (``override.tf``, ``*_override.tf``) merge into blocks of other files → full.
    3. ``.terraform.lock.hcl`` in ``config_dir`` (provider versions changed) → full.
    4. ``terraform.tfvars``, ``*.auto.tfvars`` and their ``.json`` forms in ``config_dir`` → ``variables``
       (the caller compares the values at REF and now and plans the consumers of those that changed); any
       other ``*.tfvars`` there (only read through ``-var-file``) → full.
    5. A path inside a local module's source directory (even outside ``config_dir``) → ``module:NAME``
       for every call of that directory.
    6. A path read by ``file()``/``templatefile()`` → ``files:…`` with its readers, which join ``files``
       (a reader inside a module directory widens to that module call instead; any other reader → full).
    7. Any other path inside ``config_dir`` (a ``.tf`` in a subdirectory no known module uses, a
       ``.tfvars`` in a subdirectory, a README or JSON nobody is known to read) → full: it may feed the
       configuration through a path the analysis could not see.
    8. Any other path outside ``config_dir`` → unrelated.

    Type changes (a file became a symbolic link or a submodule, or back) and unmerged paths that rules
    1-8 would not call unrelated are failures, as is any unknown kind of change.
    """
    builder = _ScopeBuilder(_normalise_dir(config_dir), texts_at_ref, module_sources, file_readers, artifacts)
    for entry in entries:
        builder.add(entry)
    return builder.build()


def _normalise_dir(config_dir: str) -> str:
    cleaned = posixpath.normpath(config_dir.strip() or ".")
    if cleaned.startswith("/") or cleaned == ".." or cleaned.startswith("../"):
        raise ValueError(f"config_dir must be relative to the repository root and inside it, not {config_dir!r}")
    return "" if cleaned == "." else cleaned


def _relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` (both repository-relative), with ``..`` steps when it lies outside."""
    parts = [p for p in posixpath.normpath(path).split("/") if p not in ("", ".")]
    base_parts = base.split("/") if base else []
    common = 0
    while common < min(len(parts), len(base_parts)) and parts[common] == base_parts[common]:
        common += 1
    return "/".join([".."] * (len(base_parts) - common) + parts[common:])


def _is_inside(rel: str, directory: str) -> bool:
    return directory not in ("", ".") and (rel == directory or rel.startswith(directory + "/"))


def _is_outside(rel: str) -> bool:
    return rel == ".." or rel.startswith("../")


def _is_top_level(rel: str) -> bool:
    return "/" not in rel and rel not in ("", "..")


def _is_config_file(name: str) -> bool:
    return name.endswith(_CONFIG_SUFFIXES)


def _is_override(name: str) -> bool:
    stem = name.removesuffix(".json").removesuffix(".tf")
    return stem == "override" or stem.endswith("_override")


def _is_auto_loaded(name: str) -> bool:
    return name in ("terraform.tfvars", "terraform.tfvars.json") or name.endswith((".auto.tfvars",
                                                                                    ".auto.tfvars.json"))


def _ignore_reason(rel: str) -> str | None:
    parts = rel.split("/")
    name = parts[-1]
    if ".terraform" in parts[:-1]:
        return "Terraform's working directory (.terraform/)"
    if name in _STATE_NAMES or name.endswith(_STATE_SUFFIXES):
        return "Terraform state, not configuration"
    if name.endswith("~") or (len(name) > 1 and name.startswith("#") and name.endswith("#")):
        return "an editor backup, which Terraform skips"
    if name.startswith(".") and _is_config_file(name):
        return "a hidden file, which Terraform skips when loading configuration"
    return None


class _ScopeBuilder:
    """Accumulates one :func:`scope_changes` call; every rule above lives in one of its methods."""

    def __init__(self, config_dir: str, texts_at_ref: Mapping[str, str], module_sources: Mapping[str, str],
                 file_readers: Mapping[str, tuple[str, ...]], artifacts: frozenset[str] = frozenset()) -> None:
        self.config_dir = config_dir
        self.artifacts = artifacts
        self.texts_at_ref = texts_at_ref
        self.module_dirs = {name: posixpath.normpath(src) for name, src in module_sources.items()}
        self.readers = {posixpath.normpath(path): tuple(tfs) for path, tfs in file_readers.items()}
        self.full_plan = f"run a full plan instead: kl plan{' -C ' + config_dir if config_dir else ''} without -f"
        self.files: dict[str, None] = {}
        self.deleted: dict[str, DeletedFile] = {}
        self.widen: dict[Widening, None] = {}
        self.failures: dict[str, None] = {}
        self.unrelated: dict[str, None] = {}

    def add(self, entry: DiffEntry) -> None:
        change = entry.change
        if change in (Change.ADDED, Change.MODIFIED, Change.COPIED):
            self._touch(entry.path, removed=False)
        elif change == Change.DELETED:
            self._touch(entry.path, removed=True)
        elif change == Change.RENAMED:
            self._rename(entry)
        elif change == Change.TYPE_CHANGED:
            self._refuse(entry.path, "its type changed (a regular file became a symbolic link or a submodule, or "
                                     "back), so what the configuration reads through it cannot be analysed; "
                                     f"commit it as a regular file, or {self.full_plan}")
        elif change == Change.UNMERGED:
            self._refuse(entry.path, "has unresolved merge conflicts; resolve them and try again")
        else:
            self.failures[f"{entry.path}: unknown kind of change {change!r}; {self.full_plan}"] = None

    def build(self) -> ChangeScope:
        # A reader that is itself deleted has no file to pass as -f; its old text is analysed instead.
        files = sorted(f for f in self.files if f not in self.deleted)
        return ChangeScope(
            config_dir=self.config_dir,
            files=tuple(files),
            deleted=tuple(self.deleted[p] for p in sorted(self.deleted)),
            widen=tuple(self.widen),
            failures=tuple(self.failures),
            unrelated=tuple(sorted(self.unrelated)),
        )

    def _rel(self, path: str) -> str:
        return _relative(path, self.config_dir)

    def _is_plain_config_file(self, rel: str) -> bool:
        name = posixpath.basename(rel)
        return (_is_top_level(rel) and _is_config_file(name) and not _is_override(name)
                and _ignore_reason(rel) is None)

    def _rename(self, entry: DiffEntry) -> None:
        if entry.old_path is None:
            self.failures[f"{entry.path}: reported as renamed without its old path; {self.full_plan}"] = None
            return
        old, new = self._rel(entry.old_path), self._rel(entry.path)
        if self._is_plain_config_file(old) and self._is_plain_config_file(new):
            self.files[new] = None
            if entry.similarity != 100:
                self._delete(entry.old_path, old)
            return
        self._touch(entry.old_path, removed=True)
        self._touch(entry.path, removed=False)

    def _refuse(self, path: str, why: str) -> None:
        rel = self._rel(path)
        if _ignore_reason(rel) is not None or (
                _is_outside(rel) and not self._modules_of(rel) and rel not in self.readers):
            self.unrelated[path] = None
        else:
            self.failures[f"{path}: {why}"] = None

    def _touch(self, path: str, *, removed: bool) -> None:
        rel = self._rel(path)
        name = posixpath.basename(rel)
        if _ignore_reason(rel) is not None or self._is_artifact(path, rel):
            self.unrelated[path] = None
            return
        if _is_top_level(rel):
            if _is_config_file(name):
                if _is_override(name):
                    self._full(path, "an override file merges into blocks declared in other files")
                elif removed:
                    self._delete(path, rel)
                else:
                    self.files[rel] = None
                return
            if name == _LOCK_FILE:
                self._full(path, "the dependency lock file changed, so provider versions may differ for every "
                                 "resource")
                return
            if name.endswith(_VARS_SUFFIXES):
                if _is_auto_loaded(name):
                    self.widen[Widening(path, "variable values changed: the consumers of the variables whose "
                                              "values differ are planned", WidenKind.VARIABLES, (rel,))] = None
                else:
                    self._full(path, "a variable-definitions file Terraform does not load by itself changed "
                                     "(passed with -var-file, which this scope cannot see)")
                return
        matched = self._widen_modules(path, rel)
        matched = self._widen_readers(path, rel) or matched
        if matched:
            return
        if _is_outside(rel):
            self.unrelated[path] = None
        else:
            self._full(path, "it may feed the configuration through a path the analysis could not see (no known "
                             "module uses its directory and no file()/templatefile() is known to read it)")

    def _is_artifact(self, path: str, rel: str) -> bool:
        # A name Terraform itself loads is configuration whatever it holds.
        name = posixpath.basename(rel)
        if path not in self.artifacts or _is_config_file(name) or name.endswith(_VARS_SUFFIXES) or name == _LOCK_FILE:
            return False
        return not self._modules_of(rel) and posixpath.normpath(rel) not in self.readers

    def _delete(self, path: str, rel: str) -> None:
        text = self.texts_at_ref.get(path)
        if text is None:
            self.failures[f"{path}: removed since REF but its text at REF was not supplied, so the addresses it "
                          f"declared cannot be planned for destruction; {self.full_plan}"] = None
        else:
            self.deleted[rel] = DeletedFile(rel, text)

    def _full(self, path: str, reason: str) -> None:
        self.widen[Widening(path, f"{reason}; {self.full_plan}", WidenKind.FULL)] = None

    def _modules_of(self, rel: str) -> list[str]:
        return sorted(name for name, directory in self.module_dirs.items() if _is_inside(rel, directory))

    def _widen_modules(self, path: str, rel: str) -> bool:
        names = self._modules_of(rel)
        for name in names:
            reason = f"inside {self.module_dirs[name]}, the source of module {name!r}: plans module.{name}.*"
            self.widen[Widening(path, reason, WidenKind.MODULE, (name,))] = None
        return bool(names)

    def _widen_readers(self, path: str, rel: str) -> bool:
        readers = self.readers.get(rel)
        if not readers:
            return False
        top_level: list[str] = []
        for reader in readers:
            reader_rel = posixpath.normpath(reader)
            if self._is_plain_config_file(reader_rel):
                top_level.append(reader_rel)
                continue
            names = self._modules_of(reader_rel)
            for name in names:
                reason = f"read by {reader_rel}, inside the source of module {name!r}: plans module.{name}.*"
                self.widen[Widening(path, reason, WidenKind.MODULE, (name,))] = None
            if not names:
                self._full(path, f"read by {reader_rel}, which is neither a file directly in the configuration "
                                 "directory nor inside a known module")
        if top_level:
            listed = ",".join(sorted(top_level))
            self.widen[Widening(path, f"read by file()/templatefile() in {listed}", WidenKind.FILES,
                                tuple(sorted(top_level)))] = None
            self.files.update(dict.fromkeys(top_level))
        return True
