"""The repository's ``.kilolock.yml``: which directories are Kilolock projects, which changed files
trigger them, and how merges are applied.

Owns: reading the file as it is (``RawConfig``, atlantis's raw shape), validating it into frozen
dataclasses (``BotConfig``, ``Project``) with every problem listed at once (each key's type and value through
the models of ``runner.bot.configfile``; here what needs the checkout or the file's lines), discovering projects when
the file is absent (each directory whose ``.tf`` files hold a ``backend "http"`` block), and matching
changed paths to projects with the trigger globs. Errors are :class:`BotConfigError`; the jobs report
them in the check run, because nobody reads a worker's log.

Must not: talk to GitHub, git or the server, or decide what a change means for a plan (the file-scoped
analysis does that for every triggered project).

The format::

    apply_on_merge: true        # apply each project a merged pull request touches (default true)
    apply_on_push: false        # apply pushes to the default branch that are not merged PRs (default false)
    merge_wait: 10m             # how long a merge apply waits for reservations (default 10m)
    apply_on_comment: false     # let `kilolock apply` comments apply before merge (default false)
    apply_requirements: [approved, mergeable]   # gate of comment applies (also: undiverged, owners_approved; [])
    owners: {"*": "@org/platform"}   # address glob → owners (runner.bot.owners), for every project
    drift: {every: 6h, issue: true}   # scheduled drift check of the default branch (default: none)
    env: [AWS_PROFILE, AWS_REGION, "TF_VAR_*"]  # the worker's variables Terraform may see (default: none)
    hold_expiry: 7d             # pull-request holds older than this are released (default: never)
    projects:
      - dir: infra/prod         # the Terraform root module, relative to the repository root
        name: prod              # default: the directory (the state's name for the root directory)
        state: prod             # default: from the directory's backend "http" block
        files: ["infra/prod/**", "modules/**", "!**/*.md"]   # default: the directory and its local modules
        apply_on_merge: true    # default: the top-level value
        apply_on_comment: true  # default: the top-level value
        env: [GOOGLE_APPLICATION_CREDENTIALS]   # added to the top-level list for this project
        owners: {"module.payments.*": ["@org/payments", "@alice"]}   # after the top-level owners

Comment applies read ``apply_on_comment``, ``apply_requirements`` and ``owners`` from the default branch's file only
(``runner.bot.pr_holds``), so a pull request cannot relax its own gate. Likewise ``env``, ``hold_expiry`` and
each project's state and server: the bot takes them from the default branch's file (``runner.bot.flow``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from analyzer.globs import GlobError, parse_glob
from analyzer.hcl import HclError, ParseCache, find_http_backend
from app.wiremodels import Wire, collect
from runner.bot.configfile import DEFAULT_MERGE_WAIT, DEFAULT_REQUIREMENTS, DriftKeys, FileKeys, ProjectKeys
from runner.bot.owners import MAX_OWNERS_PER_RULE, MAX_RULES, OwnerHandleError, OwnerRule, parse_owner
from runner.core.config import ClientConfigError, read_tf_files, split_backend_address

CONFIG_NAMES = (".kilolock.yml", ".kilolock.yaml")
_SKIP_DIRS = frozenset({".git", ".terraform", "node_modules"})


class BotConfigError(Exception):
    """``.kilolock.yml`` is invalid; ``problems`` lists every one, each saying what to change."""

    def __init__(self, problems: Iterable[str], *, source: str = CONFIG_NAMES[0]) -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__(f"{source} is invalid:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True, slots=True)
class RawConfig:
    """The file as read: a mapping, not yet validated (None when the repository has no file)."""

    source: str
    document: Mapping[str, Any] | None
    text: str = ""  # the file's text, for the line numbers of owners: rules


@dataclass(frozen=True, slots=True)
class DriftSchedule:
    """``drift: {every: 6h, issue: true}``: check the project's default-branch configuration for drift once
    per window of ``every`` seconds; with ``issue``, keep one GitHub issue per project up to date."""

    every: int
    issue: bool = False


@dataclass(frozen=True, slots=True)
class Project:
    """One Terraform root module the bot plans and applies.

    ``dir`` is repository-relative with ``/`` separators (``""`` for the root); ``address`` is the
    Kilolock server from the directory's backend block (None: the worker's ``KL_PUBLIC_URL``);
    ``files`` are the trigger globs, repository-relative, ``!`` marking an exclusion.
    """

    name: str
    dir: str
    state: str
    address: str | None
    files: tuple[str, ...]
    apply_on_merge: bool
    apply_on_comment: bool = False
    drift: DriftSchedule | None = None
    env: tuple[str, ...] = ()  # the worker's variables this project's Terraform sees (runner.core.childenv)
    # The top-level owners: rules, then the project's own (later rules win: runner.bot.owners).
    owners: tuple[OwnerRule, ...] = ()

    @property
    def shown_dir(self) -> str:
        return self.dir or "."


@dataclass(frozen=True, slots=True)
class BotConfig:
    projects: tuple[Project, ...]
    apply_on_merge: bool = True
    apply_on_push: bool = False
    merge_wait: int = DEFAULT_MERGE_WAIT
    source: str = "discovered"
    apply_requirements: tuple[str, ...] = DEFAULT_REQUIREMENTS
    hold_expiry: int | None = None  # seconds after which a pull-request hold is released
    # Read from the default branch only: the branch whose merges apply (None: the default branch), and
    # whether untrusted pull requests get credential-free previews (runner.bot.trust).
    apply_branch: str | None = None
    untrusted_previews: bool = False

    def project(self, name: str) -> Project | None:
        return next((p for p in self.projects if p.name == name), None)


def load(root: Path) -> BotConfig:
    """The validated configuration of the checkout at ``root`` (discovered when there is no file).

    Raises :class:`BotConfigError` listing every problem.
    """
    return validate(read_raw(root), root)


def read_raw(root: Path) -> RawConfig:
    for name in CONFIG_NAMES:
        path = root / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            return RawConfig(name, parse(text, source=name), text)
    return RawConfig("discovered", None)


def parse(text: str, *, source: str = CONFIG_NAMES[0]) -> Mapping[str, Any]:
    """YAML text → the top-level mapping; an empty file is an empty mapping."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BotConfigError([f"not valid YAML{where}: {problem}"], source=source) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise BotConfigError([f"the top level must be a mapping (apply_on_merge:, projects: …), not a "
                              f"{type(doc).__name__}"], source=source)
    return doc


def validate(raw: RawConfig, root: Path) -> BotConfig:
    """Check every field and resolve defaults against the checkout (states from backend blocks,
    trigger globs from local module calls)."""
    if raw.document is None:
        return BotConfig(projects=tuple(_project_from(d, None, None, None, True, root, [], "")
                                        for d in discover(root)), source="discovered")
    doc = raw.document
    keys, found = collect(FileKeys, doc)
    top = _Problems(FileKeys, found)
    apply_on_merge, apply_on_comment = keys.apply_on_merge, keys.apply_on_comment
    drift = drift_schedule(keys.drift, "drift", top.under("drift"))
    env = tuple(dict.fromkeys(keys.env or ()))
    lines = owner_lines(raw.text) if _has_owners(doc) else {}
    owners = owner_rules(keys.owners, "owners", lines.get(None, ()), top.under("owners"))
    items = keys.projects
    projects: list[Project] = []
    problems = top.listed()
    if items is None:
        projects = [replace(_project_from(d, None, None, None, apply_on_merge, root, problems, "", apply_on_comment),
                            drift=drift, env=env, owners=owners) for d in discover(root)]
    elif not isinstance(items, list) or not items:
        problems.append("projects must be a non-empty list of {dir: …} mappings (or left out to discover them)")
    else:
        for index, item in enumerate(items):
            where = f"projects[{index}]"
            if not isinstance(item, dict):
                problems.append(f"{where} must be a mapping with at least dir:, got {item!r}")
                continue
            own, found = collect(ProjectKeys, item)
            mine = _Problems(ProjectKeys, [(key, f"{where}: {p}") for key, p in found])
            directory = _directory(own.dir, where, root, mine.under("dir"))
            if directory is None:  # nothing else about a project without its directory
                problems += mine.listed(only=("", "dir"))
                continue
            files = _globs(own.files, where, mine.under("files"))
            own_drift = (drift_schedule(item["drift"], f"{where}: drift", mine.under("drift")) if "drift" in item
                         else drift)
            own_env = env + tuple(n for n in dict.fromkeys(own.env or ()) if n not in env)
            own_owners = owners + owner_rules(own.owners, f"{where}: owners", lines.get(index, ()),
                                              mine.under("owners"))
            problems += mine.listed()
            own_apply = apply_on_merge if own.apply_on_merge is None else own.apply_on_merge
            own_comment = apply_on_comment if own.apply_on_comment is None else own.apply_on_comment
            projects.append(replace(_project_from(directory, own.name, own.state, files, own_apply, root, problems,
                                                  where, own_comment), drift=own_drift, env=own_env, owners=own_owners))
    seen: dict[str, int] = {}
    for project in projects:
        seen[project.name] = seen.get(project.name, 0) + 1
    problems += [f"project name {name!r} is used {count} times: give each project a unique name"
                 for name, count in seen.items() if count > 1]
    if problems:
        raise BotConfigError(problems, source=raw.source)
    return BotConfig(projects=tuple(projects), apply_on_merge=apply_on_merge, apply_on_push=keys.apply_on_push,
                     merge_wait=keys.merge_wait, source=raw.source, apply_requirements=tuple(keys.apply_requirements),
                     hold_expiry=keys.hold_expiry, apply_branch=keys.apply_branch,
                     untrusted_previews=keys.untrusted_previews)


class _Problems:
    """The problems of one mapping of the file, each under the key it is about ("" for unknown keys), listed
    in the format's order: unknown keys first, then each key's in the order the model declares them."""

    def __init__(self, keys: type[Wire], found: list[tuple[str, str]]) -> None:
        self._order = ["", *keys.model_fields]
        self._found = list(found)
        self._lists: list[tuple[str, list[str]]] = []

    def under(self, key: str) -> list[str]:
        """A list a check appends the problems of ``key`` to."""
        self._lists.append((key, []))
        return self._lists[-1][1]

    def listed(self, only: tuple[str, ...] | None = None) -> list[str]:
        found = self._found + [(key, p) for key, items in self._lists for p in items]
        return [p for key, p in sorted(found, key=lambda kp: self._order.index(kp[0]))
                if only is None or key in only]


def discover(root: Path) -> list[str]:
    """Repository-relative directories whose ``.tf`` files hold a ``backend "http"`` block (a directory
    whose backend block cannot be parsed is included, so that the error is reported, not skipped)."""
    found: list[str] = []
    for path in sorted(root.rglob("*.tf")):
        rel = path.parent.relative_to(root)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts):
            continue
        directory = "" if rel.as_posix() == "." else rel.as_posix()
        if directory in found or "backend" not in path.read_text(errors="replace"):
            continue
        try:
            if find_http_backend({path.name: path.read_text(errors="replace")}) is None:
                continue
        except HclError:
            pass
        found.append(directory)
    return found


def projects_for(config: BotConfig, paths: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Project name → the changed repository paths that trigger it (projects no path triggers are left out)."""
    changed = tuple(paths)
    found: dict[str, tuple[str, ...]] = {}
    for project in config.projects:
        hits = tuple(p for p in changed if is_triggered(project.files, p))
        if hits:
            found[project.name] = hits
    return found


def is_triggered(globs: Sequence[str], path: str) -> bool:
    """Whether ``path`` matches some glob and no later ``!`` glob excludes it again (gitignore order)."""
    hit = False
    for glob in globs:
        if glob.startswith("!"):
            if hit and _compiled(glob[1:]).fullmatch(path):
                hit = False
        elif not hit and _compiled(glob).fullmatch(path):
            hit = True
    return hit


@lru_cache(maxsize=512)
def _compiled(glob: str) -> re.Pattern[str]:
    """``**`` spans directories, ``*`` and ``?`` stay inside one; a trailing ``/`` means the whole tree."""
    if glob.endswith("/"):
        glob += "**"
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


def _project_from(directory: str, name: str | None, state: str | None, files: tuple[str, ...] | None,
                  apply_on_merge: bool, root: Path, problems: list[str], where: str,
                  apply_on_comment: bool = False) -> Project:
    label = f"{where} (dir {directory or '.'})" if where else f"{directory or '.'}"
    texts = read_tf_files(root / directory) if (root / directory).is_dir() else {}
    address = None
    try:
        block = find_http_backend(texts)
    except HclError as exc:
        problems.append(f"{label}: {exc}")
        block = None
    if block is not None and block.address:
        try:
            address, from_block = split_backend_address(block.address)
        except ClientConfigError as exc:
            problems.append(f"{label}: backend \"http\" address: {exc}")
            from_block = None
        state = state or from_block
    if not state:
        problems.append(f"{label}: no state name: add state: NAME, or a backend \"http\" block whose address "
                        "ends in /v1/states/NAME")
    if files is None:
        files = default_triggers(directory, texts)
    return Project(name=name or directory or state or ".", dir=directory, state=state or "", address=address,
                   files=files, apply_on_merge=apply_on_merge, apply_on_comment=apply_on_comment)


def default_triggers(directory: str, texts: Mapping[str, str]) -> tuple[str, ...]:
    """The directory's whole tree, and the tree of every local module it calls."""
    from runner.core.scope import module_sources

    prefix = f"{directory}/" if directory else ""
    globs = [f"{prefix}**"]
    for source in sorted(set(module_sources(texts, ParseCache()).values())):
        joined = posixpath.normpath(posixpath.join(directory or ".", source))
        if joined.startswith("..") or joined == ".":
            continue
        if not any(is_triggered([g], joined + "/x") for g in globs):
            globs.append(f"{joined}/**")
    return tuple(globs)


def _directory(value: Any, where: str, root: Path, problems: list[str]) -> str | None:
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{where}: dir is required: the Terraform root module's directory, relative to the "
                        "repository root ('.' for the root)")
        return None
    cleaned = posixpath.normpath(value.strip().strip("/") or ".")
    if cleaned.startswith("..") or posixpath.isabs(value.strip()):
        problems.append(f"{where}: dir {value!r} must stay inside the repository")
        return None
    cleaned = "" if cleaned == "." else cleaned
    if not (root / cleaned).is_dir():
        problems.append(f"{where}: dir {value!r} does not exist in this commit")
        return None
    return cleaned


def _globs(value: Any, where: str, problems: list[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        problems.append(f"{where}: files must be a list of glob strings such as \"infra/prod/**\", got {value!r}")
        return None
    globs = tuple(v.strip().lstrip("/") if not v.strip().startswith("!") else "!" + v.strip()[1:].lstrip("/")
                  for v in value)
    if all(g.startswith("!") for g in globs):
        problems.append(f"{where}: files has only exclusions (!…): add a glob that includes something")
    return globs


def drift_schedule(value: Any, where: str, problems: list[str]) -> DriftSchedule | None:
    """``drift:``: absent, null or false (no scheduled check), or ``{every: DURATION, issue: BOOL}``."""
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        problems.append(f"{where} must be a mapping such as {{every: 6h}} or {{every: 6h, issue: true}} (or false), "
                        f"got {value!r}")
        return None
    keys, found = collect(DriftKeys, value)
    if "every" not in value:
        problems += [f"{where}: {p}" for key, p in found if key == ""]
        problems.append(f"{where}: every is required: how often to check, such as 6h, 30m or 1d")
        return None
    problems += [f"{where}: {p}" for _, p in found]
    return DriftSchedule(keys.every, keys.issue) if keys.every is not None else None


# --- owners: -------------------------------------------------------------------------------------------

OwnerKeys = tuple[tuple[str, int], ...]  # (glob text, line) of each key of one owners: mapping, in file order


def _has_owners(doc: Mapping[str, Any]) -> bool:
    items = doc.get("projects")
    return "owners" in doc or (isinstance(items, list) and any(isinstance(i, dict) and "owners" in i for i in items))


def owner_lines(text: str) -> dict[int | None, OwnerKeys]:
    """Where each key of the ``owners:`` mappings is in ``text``: None for the top level, the index of a
    project for its own (duplicate keys kept, which a parsed mapping would have lost)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    found: dict[int | None, OwnerKeys] = {}
    if not isinstance(node, yaml.MappingNode):
        return found
    for key, value in node.value:
        if key.value == "owners" and isinstance(value, yaml.MappingNode):
            found[None] = _keys(value)
        elif key.value == "projects" and isinstance(value, yaml.SequenceNode):
            for index, item in enumerate(value.value):
                if isinstance(item, yaml.MappingNode):
                    for k, v in item.value:
                        if k.value == "owners" and isinstance(v, yaml.MappingNode):
                            found[index] = _keys(v)
    return found


def _keys(node: yaml.MappingNode) -> OwnerKeys:
    return tuple((str(k.value), k.start_mark.line + 1) for k, _ in node.value)


def owner_rules(value: Any, where: str, keys: OwnerKeys, problems: list[str]) -> tuple[OwnerRule, ...]:
    """``owners:``: a mapping of address globs to ``@user`` / ``@org/team`` (one, a list, or ``[]`` for
    unowned), in file order. Each problem names the line."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        problems.append(f"{where} must be a mapping of address globs to owners, such as "
                        f"{{\"module.payments.*\": \"@acme/payments\"}}, got {value!r}")
        return ()
    if len(value) > MAX_RULES:
        problems.append(f"{where} has {len(value)} rules; at most {MAX_RULES} are allowed")
        return ()
    line_of: dict[str, int] = {}
    for text, line in keys:
        if text in line_of:
            problems.append(f"line {line}: {where}: {text!r} is listed again (first on line {line_of[text]}): "
                            "keep one entry per glob")
        else:
            line_of[text] = line
    rules: list[OwnerRule] = []
    for glob, owners in value.items():
        line = line_of.get(str(glob), 0)
        at = f"line {line}: {where}" if line else where
        if not isinstance(glob, str):
            problems.append(f"{at}: the glob {glob!r} must be a string such as \"module.payments.*\"")
            continue
        try:
            parse_glob(glob)
        except GlobError as exc:
            problems.append(f"{at}: invalid address glob {glob!r}: {exc}")
            continue
        handles = [] if owners is None else [owners] if isinstance(owners, str) else owners
        if not isinstance(handles, list) or len(handles) > MAX_OWNERS_PER_RULE:
            problems.append(f"{at}: the owners of {glob!r} must be \"@user\", \"@org/team\" or a list of at most "
                            f"{MAX_OWNERS_PER_RULE} of them ([] for none), got {owners!r}")
            continue
        parsed = []
        for handle in handles:
            try:
                parsed.append(parse_owner(handle))
            except OwnerHandleError as exc:
                problems.append(f"{at}: {exc}; write it in quotes with its @, such as '@alice' or '@org/team'")
        rules.append(OwnerRule(glob, tuple(dict.fromkeys(parsed)), line))
    return tuple(rules)
