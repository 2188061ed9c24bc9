"""The workspace stage: the one builder of a run's private Terraform workspace — a full copy of the
configuration, or the minimal cut of a file-scoped change (the footprint's blocks cut out of their files,
the local modules copied into the same layout, the variable-definitions files Terraform loads by itself
carried) — with the trunk part it starts from as terraform.tfstate and the local-backend override.

What a workspace is on disk (copying rules, hashes, the plugin cache, Terraform's environment) is
``runner.core.workspace``; this module decides what goes into one, and rebuilds an apply's workspace the
way its plan built it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from analyzer.footprint import Footprint
from analyzer.hcl import HclError, ParseCache
from analyzer.scoping import Selection, cut_blocks, local_module_sources
from runner.core import workspace
from runner.core.config import read_configuration, read_tf
from runner.core.engine_client import EngineClient
from runner.core.errors import InvalidInput
from runner.core.git import work_tree_root
from runner.core.parsecache import load_cache
from runner.core.scope import footprint
from runner.core.spec import PlanMode, PlanSpec
from runner.core.terraform import TerraformBinary
from runner.core.trunk import Snapshot, described_part, fetch_slice, fetch_snapshot


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the configuration and its local modules sit: ``root`` is the lowest directory holding the
    configuration directory and every local module the workspace needs (nested calls followed), and
    ``modules`` those module directories. The workspace reproduces this tree under one private directory,
    so every ``../`` source resolves inside it."""

    root: Path
    config: Path
    modules: tuple[Path, ...]

    def at(self, dest: Path, path: Path) -> Path:
        return dest / path.relative_to(self.root)


@dataclass(frozen=True, slots=True)
class Cut:
    """A minimal workspace's configuration: the root files, the footprint whose blocks are cut from them,
    the layout of the local modules it calls, and the variable-definitions files Terraform loads by itself
    (``workspace.auto_var_files``, listed once: what the workspace carries is what the plan pins)."""

    files: Mapping[str, str]
    footprint: Footprint
    layout: Layout
    var_files: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class Prepared:
    """A workspace ready to re-plan, with the slice it starts from."""

    ws: workspace.Workspace
    slice_raw: bytes | None
    slice_addresses: list[str]


@dataclass(frozen=True, slots=True)
class SavedPlan:
    """The plan phase's workspace, kept for the apply of the same ``kl apply -f`` invocation: ``prepared``
    holds the saved plan (kl.tfplan) beside the slice it was made over; ``spec`` is what that plan produced
    and ``binary`` the Terraform that made it."""

    prepared: Prepared
    spec: PlanSpec
    binary: TerraformBinary


# Builds the run's workspace under the given directory (it must not exist yet).
Builder = Callable[[Path], Prepared]


def module_layout(config_dir: Path, fp: Footprint, cache: ParseCache, boundary: Path | None) -> Layout:
    """The layout of ``fp``'s local modules; refuses (exit 3) a module outside ``boundary`` (the git work tree
    holding the configuration, when there is one) or a layout whose root would be the filesystem root."""
    config = config_dir.resolve()
    found: dict[Path, None] = {}
    queue = [(config, source, "the configuration") for source in fp.module_dirs]
    while queue:
        base, source, caller = queue.pop()
        directory = (base / source).resolve()
        if directory in found or directory == config:
            continue
        if boundary is not None and not directory.is_relative_to(boundary):
            raise InvalidInput(f"module source {source!r} in {caller} resolves to {directory}, outside {boundary} "
                            "(the repository holding the configuration): a workspace never reaches outside it; "
                            "move the module inside, or run kl plan without -f (a full plan)")
        if not directory.is_dir():
            raise InvalidInput(f"module source {source!r} in {caller} is not a directory ({directory}): fix the "
                            "source, or run kl plan without -f (a full plan)")
        found[directory] = None
        try:
            nested = local_module_sources(read_tf(directory), cache)
        except HclError as exc:
            raise InvalidInput(f"{exc}: fix that file of module {source!r}, or run kl plan without -f") from exc
        queue.extend((directory, nested_source, str(directory)) for nested_source in nested.values())
    root = config
    for directory in found:
        while not directory.is_relative_to(root):
            root = root.parent
    if root == Path(root.anchor):
        raise InvalidInput(f"the configuration and its local modules only meet at {root}: a workspace would "
                        "reproduce the whole filesystem; run kl plan without -f (a full plan)")
    return Layout(root, config, tuple(sorted(found)))


def cut(config_dir: Path, files: Mapping[str, str], fp: Footprint, cache: ParseCache) -> Cut:
    """The minimal cut of ``fp`` out of ``files``, its modules laid out inside the git work tree holding the
    configuration (when there is one)."""
    return Cut(files, fp, module_layout(config_dir, fp, cache, work_tree_root(config_dir)),
               tuple(workspace.auto_var_files(config_dir)))


def build(config_dir: Path, dest: Path, state: bytes | None, cut: Cut | None = None) -> workspace.Workspace:
    """The workspace under ``dest`` (which must not exist): the whole configuration copied (``cut`` None), or
    the cut's blocks (formatting kept) in the configuration's place in the layout, the local module
    directories in theirs, and the files Terraform or the blocks read carried; then the local-backend
    override and ``state`` (the trunk part it starts from) as terraform.tfstate."""
    if cut is None:
        return workspace.build(config_dir, dest, state)
    layout = cut.layout
    ws = layout.at(dest, layout.config)
    ws.mkdir(parents=True)
    for name, text in cut_blocks(cut.files, cut.footprint).items():
        (ws / name).write_text(text, encoding="utf-8", errors="surrogateescape")
    for module in layout.modules:
        shutil.copytree(module, layout.at(dest, module), dirs_exist_ok=True, symlinks=True,
                        ignore=_module_ignore({layout.config}))
    for extra in (*carried_files(config_dir, cut.footprint), *cut.var_files):
        target = ws / extra.relative_to(config_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(extra, target)
    workspace.carry_lock_file(config_dir, ws)
    (ws / workspace.OVERRIDE_NAME).write_text(workspace.OVERRIDE)
    built = workspace.Workspace(ws)
    if state is not None:
        built.state_file.write_bytes(state)
    return built


def prepare(config_dir: Path, dest: Path, part: Snapshot, cut: Cut | None = None) -> Prepared:
    """``build`` over the trunk part ``part``, kept beside it."""
    return Prepared(build(config_dir, dest, part.raw, cut), part.raw, part.addresses)


def _module_ignore(skip: set[Path]) -> Callable[[str, list[str]], set[str]]:
    patterns = shutil.ignore_patterns(".terraform", ".git", workspace.ARTIFACT_DIR, "*.tfstate*", "*.igplan",
                                      "kl-plan.json")

    def ignore(directory: str, names: list[str]) -> set[str]:
        dropped = set(patterns(directory, names))
        # The configuration directory inside a module's tree (an example calling ``../..``) is the workspace's
        # own place: never merged with the original files.
        return dropped | {n for n in names if (Path(directory) / n).resolve() in skip}

    return ignore


def carried_files(config_dir: Path, fp: Footprint) -> list[Path]:
    """Non-.tf files the workspace must carry: when a block reads files (file(), templatefile()…),
    every file of the configuration directory that is not Terraform's own."""
    if not any(d.construct == "file_function" for d in fp.diagnostics):
        return []
    return [p for p in workspace.copied_files(config_dir) if not p.name.endswith((".tf", ".tf.json"))]


def rebuild(client: EngineClient, spec: PlanSpec, config_dir: Path, *, data_dir: Path,
            deleted: Mapping[str, str] | None = None, planned: Footprint | None = None) -> Builder:
    """The apply's workspace, built as its plan built it. A full plan: the whole configuration over the trunk
    instances it describes, as the plan saw the trunk. A file-scoped plan: the same minimal cut (from
    ``planned``, the plan's footprint, when the caller kept it; else recomputed from the files, ``deleted``
    and the parse cache under ``data_dir``) over a fresh slice of the same globs."""
    if spec.mode != PlanMode.FILES:
        def build_full(dest: Path) -> Prepared:
            # The trunk as the plan saw it. The reserved addresses cannot have changed since (the stale
            # check guarantees it), and every other address is this checkout's business only if it
            # writes it: starting from the head would re-plan, and revert, other runs' commits the
            # checkout does not know about. The server diffs against the same base serial.
            snapshot = fetch_snapshot(client, spec.state, serial=spec.base_serial or None)
            return prepare(config_dir, dest, described_part(snapshot, frozenset(spec.described_resources)))

        return build_full

    def build_cut(dest: Path) -> Prepared:
        files = read_configuration(config_dir)
        cache = load_cache(data_dir)
        selection = Selection(spec.selected_files, dict(deleted or {}), spec.seed_variables)
        fp = planned or footprint(files, selection, cache, deleted=spec.deleted_globs)
        minimal = cut(config_dir, files, fp, cache)
        slice_raw, slice_addresses, _ = fetch_slice(client, spec.state, spec.slice_globs,
                                                    frozenset(spec.described_resources))
        return Prepared(build(config_dir, dest, slice_raw, minimal), slice_raw, slice_addresses)

    return build_cut
