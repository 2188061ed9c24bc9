"""File-scoped plans and applies (``kl plan -f``, ``kl apply X.igplan``, ``kl apply -f``): Terraform
runs only over a minimal workspace cut out of the selected files and the blocks they need, against
a slice of the trunk fetched by glob — never over the whole configuration or the whole state.

The footprint (what is written, read, needed) comes from ``analyzer.footprint``; this module reads
the files, builds the workspace, talks to the server through the engine client, and reuses the
sliced-apply path (``runner.apply``) for reserving, applying and committing.
"""

from __future__ import annotations

import gc
import hashlib
import pickle
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from analyzer.configuration import is_described
from analyzer.footprint import Footprint, compute_footprint
from analyzer.gitdiff import ChangeScope
from analyzer.globs import intersects, matches, parse_glob
from analyzer.hcl import ParseCache, content_digest
from analyzer.plan import PlanFormatError, analyze_plan
from analyzer.prescan import scan
from analyzer.state import ParsedState, assemble_state, parse_state
from runner import workspace
from runner.apply import ApplyOptions, ApplyOutcome, Builder, Prepared, apply_spec, check_spec
from runner.engine_client import EngineClient, EngineError
from runner.plan import KlExit, TerraformContext, pin_variables, plan_in_workspace, sensitive_variables
from runner.spec import PlanSpec

LOCALS_FILE = "kilolock_locals.tf"


@dataclass(frozen=True, slots=True)
class Selection:
    """What to plan: configuration-relative .tf files, and files deleted since a git ref (their text
    at the ref), whose declared addresses must be planned for destruction."""

    files: tuple[str, ...]
    deleted: Mapping[str, str] = field(default_factory=dict)


def read_configuration(config_dir: Path) -> dict[str, str]:
    """The root module's .tf and .tf.json files, by name (modules are copied whole, not read here)."""
    found: dict[str, str] = {}
    for path in sorted(config_dir.iterdir()):
        if path.is_file() and path.name.endswith((".tf", ".tf.json")) and path.name != workspace.OVERRIDE_NAME:
            found[path.name] = path.read_text(encoding="utf-8", errors="surrogateescape")
    return found


def _cache_path(data_dir: Path) -> Path:
    return data_dir / "hcl-cache.pickle"


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around building large, acyclic object graphs (a parse
    cache of a few hundred files, the footprint's index): it otherwise runs dozens of full passes
    over objects that can never be garbage, about half the footprint's time on large configurations."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_cache(data_dir: Path) -> ParseCache:
    """The parse cache kept between runs (by content hash, so a stale entry is never used)."""
    try:
        with open(_cache_path(data_dir), "rb") as handle:
            cache = pickle.load(handle)
        return cache if isinstance(cache, ParseCache) else ParseCache()
    except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError):
        return ParseCache()


Signature = tuple[frozenset[str], frozenset[tuple[str, int]], frozenset[str]]


def _signature(cache: ParseCache) -> Signature:
    """Which entries the cache holds (entries are immutable, so equal keys mean equal contents)."""
    return (frozenset(cache.analyses), frozenset(cache.blocks), frozenset(cache.prescans))


def prune_cache(cache: ParseCache, files: Mapping[str, str]) -> None:
    """Keep only entries for the current contents of the files (the cache never grows without bound)."""
    digests = {content_digest(text) for text in files.values()}
    for key in [k for k in cache.analyses if k not in digests]:
        del cache.analyses[key]
    for key in [k for k in cache.prescans if k not in digests]:
        del cache.prescans[key]
    for block_key in [k for k in cache.blocks if k[0] not in digests]:
        del cache.blocks[block_key]


def save_cache(data_dir: Path, cache: ParseCache, *, loaded: Signature | None = None) -> None:
    """Persist the cache (skipped when nothing changed since ``loaded``, its signature when read)."""
    if loaded is not None and _signature(cache) == loaded:
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = _cache_path(data_dir).with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(cache, handle, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(_cache_path(data_dir))


def deleted_globs(deleted: Mapping[str, str]) -> tuple[str, ...]:
    """What the deleted files declared (their destruction is part of the write footprint)."""
    globs: set[str] = set()
    for text in deleted.values():
        for header in scan(text).headers:
            if header.type == "resource" and len(header.labels) == 2:
                globs.add(f"{header.labels[0]}.{header.labels[1]}.*")
            elif header.type == "data" and len(header.labels) == 2:
                globs.add(f"data.{header.labels[0]}.{header.labels[1]}.*")
            elif header.type == "module" and header.labels:
                globs.add(f"module.{header.labels[0]}.*")
    return tuple(sorted(globs))


def described_in(fp: Footprint, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """Configuration-level addresses whose trunk rows the slice carries: the workspace's resource and
    module blocks (``module.NAME.*``), plus every written address — a ``moved`` source or a deleted
    declaration must be in the slice for Terraform to move or destroy it."""
    names: set[str] = set()
    for block in fp.blocks:
        if block.type in ("resource", "data", "ephemeral"):
            names.add(block.name)
        elif block.type == "module":
            names.add(block.name + ".*")
    for glob in (*fp.write_globs, *extra):
        if glob.startswith("module."):
            names.add("module." + glob.split(".")[1].split("[")[0] + ".*")
        else:
            names.add(_keyless(glob[:-2] if glob.endswith(".*") else glob))
    return tuple(sorted(names))


def _keyless(address: str) -> str:
    return address.split("[", 1)[0]


def declaring_files(files: Mapping[str, str]) -> dict[str, str]:
    """Root-level resource/data address or ``module.NAME`` → the file declaring it (prescan only)."""
    found: dict[str, str] = {}
    for name, text in files.items():
        if not name.endswith(".tf"):
            continue
        for header in scan(text).headers:
            if header.type == "resource" and len(header.labels) == 2:
                found[f"{header.labels[0]}.{header.labels[1]}"] = name
            elif header.type == "data" and len(header.labels) == 2:
                found[f"data.{header.labels[0]}.{header.labels[1]}"] = name
            elif header.type == "module" and header.labels:
                found[f"module.{header.labels[0]}"] = name
    return found


def _declared_by(address: str, declarations: Mapping[str, str]) -> str | None:
    if address.startswith("module."):
        return declarations.get("module." + address.split(".")[1].split("[")[0])
    return declarations.get(_keyless(address))


def dependents_to_add(edges: Iterable[tuple[str, str]], write_globs: Sequence[str],
                      declarations: Mapping[str, str], selected: Iterable[str]) -> dict[str, str]:
    """Files declaring trunk resources that depend on something this change writes: a full apply
    would re-plan them, so the file-scoped one must too. file → why."""
    globs = [parse_glob(g) for g in write_globs]
    chosen = set(selected)
    added: dict[str, str] = {}
    for address, depends_on in edges:
        if any(matches(g, address) for g in globs):
            continue
        target = parse_glob(depends_on + ".*")
        if not any(matches(g, depends_on) or intersects(g, target) for g in globs):
            continue
        file = _declared_by(address, declarations)
        if file and file not in chosen and file not in added:
            added[file] = f"{address} depends on {depends_on}, which this change writes"
    return added


def _diagnostics_text(fp: Footprint) -> str:
    return "\n".join(f"  {d.file}:{d.line}: {d.construct}: {d.message}" for d in fp.diagnostics
                     if d.action == "fail")


def footprint(files: Mapping[str, str], selection: Selection, cache: ParseCache,
              edges: Iterable[tuple[str, str]] = ()) -> Footprint:
    missing = [f for f in selection.files if f not in files]
    if missing:
        raise KlExit(3, f"-f {missing[0]}: no such .tf file in the configuration directory")
    fp = compute_footprint(files, selection.files, trunk_edges=edges, cache=cache)
    if fp.fails_closed:
        raise KlExit(3, "the file-scoped footprint cannot be proven safe, so nothing was planned:\n"
                        + _diagnostics_text(fp))
    return fp


def build_minimal(config_dir: Path, files: Mapping[str, str], fp: Footprint, dest: Path,
                  state: bytes | None) -> workspace.Workspace:
    """Cut the footprint's blocks out of their files (formatting kept), copy the module directories
    the workspace calls, and add the local-backend override and the slice."""
    dest.mkdir(parents=True)
    by_file: dict[str, list[str]] = defaultdict(list)
    local_texts: list[str] = []
    for block in sorted(fp.blocks, key=lambda b: (b.file, b.span.start_pos)):
        text = files[block.file]
        cut = text[block.span.start_pos:block.span.end_pos]
        for omit in sorted(block.omit, key=lambda s: s.start_pos, reverse=True):
            start, end = omit.start_pos - block.span.start_pos, omit.end_pos - block.span.start_pos
            cut = cut[:start] + cut[end:]
        if block.type == "local":
            local_texts.append(cut)
        else:
            by_file[block.file].append(cut)
    for name, parts in by_file.items():
        (dest / name).write_text("\n\n".join(parts) + "\n", encoding="utf-8", errors="surrogateescape")
    if local_texts:
        (dest / LOCALS_FILE).write_text("locals {\n" + "\n".join("  " + t for t in local_texts) + "\n}\n")
    for module_dir in fp.module_dirs:
        source = (config_dir / module_dir).resolve()
        if source.is_dir():
            shutil.copytree(source, dest / module_dir, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".terraform", "*.tfstate*"))
    for extra in carried_files(config_dir, fp):
        target = dest / extra.relative_to(config_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(extra, target)
    (dest / workspace.OVERRIDE_NAME).write_text(workspace.OVERRIDE)
    if state is not None:
        (dest / "terraform.tfstate").write_bytes(state)
    return workspace.Workspace(dest)


def carried_files(config_dir: Path, fp: Footprint) -> list[Path]:
    """Non-.tf files the workspace must carry: when a block reads files (file(), templatefile()…),
    every file of the configuration directory that is not Terraform's own."""
    if not any(d.construct == "file_function" for d in fp.diagnostics):
        return []
    return [p for p in workspace.copied_files(config_dir) if not p.name.endswith((".tf", ".tf.json"))]


def fetch_slice(client: EngineClient, state: str, globs: Sequence[str],
                described: frozenset[str]) -> tuple[bytes | None, list[str], ParsedState | None]:
    """The trunk rows under ``globs`` that the workspace describes, as a state file."""
    try:
        raw = client.slice(state, list(globs))
    except EngineError as exc:
        if exc.code == "state_not_found":
            return None, [], None
        raise
    parsed = parse_state(raw)
    if not isinstance(parsed, ParsedState):
        raise KlExit(3, f"state {state!r} is encrypted: kl cannot slice it")
    rows = [r for r in parsed.instances if is_described(r.address, described)]
    kept = assemble_state(serial=parsed.serial, lineage=parsed.lineage, terraform_version=parsed.terraform_version,
                          instances=rows, outputs=parsed.outputs)
    return kept, sorted({r.address for r in rows}), parsed


def _hash_tree(config_dir: Path, fp: Footprint) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for block in fp.blocks:
        hashes[block.file] = workspace.file_hash(config_dir / block.file)
    for name in fp.selected_files:
        hashes[name] = workspace.file_hash(config_dir / name)
    for path in carried_files(config_dir, fp):
        hashes[str(path.relative_to(config_dir))] = workspace.file_hash(path)
    for module_dir in fp.module_dirs:
        root = config_dir / module_dir
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            if path.is_file() and ".terraform" not in path.parts:
                hashes[str(path.relative_to(config_dir))] = workspace.file_hash(path)
    return hashes


@dataclass(frozen=True, slots=True)
class ScopedFootprint:
    """The footprint of a selection after widening to the trunk's dependents: what ``kl apply`` would
    reserve (``write_globs``: the footprint's writes and what deleted files declared; ``read_globs``: its
    reads and validation globs), without running Terraform. ``selection`` is the widened selection and
    ``widened`` says why each file joined it."""

    footprint: Footprint
    selection: Selection
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    deleted_globs: tuple[str, ...]
    widened: tuple[str, ...]


def derive_footprint(client: EngineClient, state: str, files: Mapping[str, str], selection: Selection,
                     cache: ParseCache) -> ScopedFootprint:
    """The file-scoped footprint of ``selection`` against the trunk's recorded dependencies, widened to the
    files of resources that depend on what it writes. Raises KlExit(3) when it fails closed."""
    gone = deleted_globs(selection.deleted)
    declarations: dict[str, str] | None = None
    widened: list[str] = []
    while True:
        fp = footprint(files, selection, cache)
        wanted = sorted(set(fp.write_globs) | set(gone))
        try:
            edges = client.edges(state, wanted) if wanted else []
        except EngineError as exc:
            if exc.code != "state_not_found":
                raise
            edges = []
        if not edges:
            break
        if declarations is None:  # only needed when the trunk knows dependents: a scan of every file
            declarations = declaring_files(files)
        more = dependents_to_add(edges, wanted, declarations, selection.files)
        if not more:
            fp = footprint(files, selection, cache, edges)
            break
        widened += [f"widened to {file}: {why}" for file, why in sorted(more.items())]
        selection = Selection(tuple(sorted(set(selection.files) | set(more))), selection.deleted)
    return ScopedFootprint(fp, selection, tuple(sorted(set(fp.write_globs) | set(gone))),
                           tuple(sorted(set(fp.read_globs) | set(fp.validation_globs))), gone, tuple(widened))


def plan_files(client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path, selection: Selection,
               var_args: Sequence[tuple[str, str]], data_dir: Path) -> PlanSpec:
    """kl plan -f: the footprint, the minimal workspace, a plan over it, and the artifact."""
    files = read_configuration(config_dir)
    with gc_paused():
        cache = load_cache(data_dir)
        loaded = _signature(cache)
        scoped = derive_footprint(client, state, files, selection, cache)
    fp, selection, gone, widened = scoped.footprint, scoped.selection, scoped.deleted_globs, list(scoped.widened)
    prune_cache(cache, files)
    save_cache(data_dir, cache, loaded=loaded)
    write_globs = scoped.write_globs
    slice_globs = tuple(sorted(set(write_globs) | set(fp.read_globs) | set(fp.validation_globs)))
    described = described_in(fp, gone)
    slice_raw, slice_addresses, snapshot = fetch_slice(client, state, slice_globs, frozenset(described))
    flags = [f"-var={raw}" if kind == "var" else f"-var-file={Path(raw).resolve()}" for kind, raw in var_args]
    with tempfile.TemporaryDirectory(prefix="kl-plan-f-") as tmp:
        ws = build_minimal(config_dir, files, fp, Path(tmp) / "ws", slice_raw)
        plan = plan_in_workspace(ctx, ws, flags, ())
    try:
        analysis = analyze_plan(plan)
    except PlanFormatError as exc:
        raise KlExit(1, f"cannot read Terraform's plan: {exc}") from exc
    globs = [parse_glob(g) for g in write_globs]
    outside = sorted(a for a in analysis.write_set if not any(matches(g, a) for g in globs))
    if outside:
        raise KlExit(3, "the workspace plans changes outside the file-scoped footprint (" + ", ".join(outside[:10])
                        + "): run kl plan without -f (a full plan)")
    warnings = widened + [f"{d.file}:{d.line}: {d.construct}: {d.message}" for d in fp.diagnostics]
    write_set = tuple(sorted(analysis.write_set))
    return PlanSpec(
        state=state, address=client.config.base_url, lineage=snapshot.lineage if snapshot else None,
        base_serial=snapshot.serial if snapshot else 0, terraform_version=analysis.terraform_version,
        config_dir=str(config_dir.resolve()), config_hash="", created_at=datetime.now(UTC).isoformat(),
        write_set=write_set, read_set=tuple(sorted(set(slice_addresses) - set(write_set))),
        write_globs=write_globs, read_globs=tuple(sorted(set(fp.read_globs) | set(fp.validation_globs))),
        actions={c.address: c.summary for c in analysis.changes if c.address in analysis.write_set},
        described_resources=described, orphans=(), warnings=tuple(warnings),
        variables=pin_variables(var_args, ctx.env, sensitive_variables(plan)),
        # A partial workspace lacks the other files' outputs; Terraform calls that a delete, but a
        # file-scoped commit never prunes outputs, so those are not changes of this plan.
        output_changes={n: "-".join(a) for n, a in analysis.output_changes.items()
                        if tuple(a) not in (("no-op",), ("delete",))},
        mode="files", selected_files=tuple(selection.files), files=_hash_tree(config_dir, fp),
        deleted_files={p: hashlib.sha256(t.encode()).hexdigest() for p, t in selection.deleted.items()},
        deleted_globs=gone, validation_globs=tuple(fp.validation_globs), slice_globs=slice_globs,
        diagnostics=tuple(asdict(d) for d in fp.diagnostics),
    )


def check_files(spec: PlanSpec, config_dir: Path) -> None:
    """Refuse (exit 2) when any file the workspace was cut from changed since kl plan -f."""
    for name, digest in spec.files.items():
        path = config_dir / name
        if not path.is_file() or workspace.file_hash(path) != digest:
            raise KlExit(2, f"{name} changed since kl plan -f: re-run kl plan -f")


def files_builder(client: EngineClient, spec: PlanSpec, config_dir: Path, data_dir: Path,
                  deleted: Mapping[str, str]) -> Builder:
    """Rebuild the same minimal workspace over a fresh slice of the same globs."""
    def build(dest: Path) -> Prepared:
        files = read_configuration(config_dir)
        cache = load_cache(data_dir)
        selection = Selection(spec.selected_files, deleted)
        fp = footprint(files, selection, cache)
        slice_raw, slice_addresses, _ = fetch_slice(client, spec.state, spec.slice_globs,
                                                    frozenset(spec.described_resources))
        return Prepared(build_minimal(config_dir, files, fp, dest, slice_raw), slice_raw, slice_addresses)

    return build


def apply_files(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, options: ApplyOptions,
                deleted: Mapping[str, str]) -> ApplyOutcome:
    config_dir = Path(spec.config_dir)
    check_files(spec, config_dir)
    check_spec(replace(spec, config_hash=workspace.config_hash(config_dir)), config_dir, ctx.env,
               options.supplied_vars)
    return apply_spec(client, ctx, spec, config_dir, options, builder=files_builder(client, spec, config_dir,
                                                                              options.data_dir, deleted), checked=True)


def selection_from_changes(scope: ChangeScope, config_dir: Path, files: Mapping[str, str]) -> Selection:
    """--changed-from: the changed files as repeated -f; widenings add files or fail closed."""
    if scope.failures:
        raise KlExit(3, "cannot scope the change safely:\n" + "\n".join(f"  {f}" for f in scope.failures)
                        + "\nrun kl plan without -f (a full plan)")
    selected = set(scope.files)
    for widening in scope.widen:
        if widening.effect == "full":
            advice = "" if "full plan" in widening.reason else "\nrun kl plan without -f (a full plan)"
            raise KlExit(3, f"{widening.path}: {widening.reason}{advice}")
        if widening.effect.startswith("files:"):
            selected.update(f for f in widening.effect[len("files:"):].split(",") if f)
        elif widening.effect.startswith("module:"):
            name = widening.effect[len("module:"):]
            callers = [f for f, text in files.items()
                       if any(h.type == "module" and h.labels[:1] == (name,) for h in scan(text).headers)]
            if not callers:
                raise KlExit(3, f"{widening.path} belongs to module {name!r}, which no root file calls: "
                                "run kl plan without -f (a full plan)")
            selected.update(callers)
    deleted = {d.path: d.text_at_ref for d in scope.deleted}
    if not selected and not deleted:
        raise KlExit(0, "no Terraform files changed: nothing to plan")
    return Selection(tuple(sorted(selected)), deleted)


def changed_selection(config_dir: Path, ref: str, *, against: str | None = None) -> Selection:
    """--changed-from REF: the selection for what changed since ``ref`` in the git repository holding
    ``config_dir`` — up to the working tree, or up to the commit ``against`` (the pull-request bot, on a
    checkout of that commit). What a still-present selected file declared at ``ref`` joins the deleted
    texts, so a block removed from it is planned for destruction. Raises runner.git.GitError, KlExit."""
    import posixpath

    from runner.git import GitError, changed_from, text_at

    texts = read_configuration(config_dir)
    scope = changed_from(config_dir, config_dir, ref, against=against,
                         module_sources=module_sources(texts, ParseCache()))
    chosen = selection_from_changes(scope, config_dir, texts)
    deleted = dict(chosen.deleted)
    for name in chosen.files:
        try:
            deleted[f"{name}@{ref}"] = text_at(config_dir, ref, posixpath.join(scope.config_dir, name))
        except GitError:
            continue  # new since the ref: nothing declared before
    return Selection(chosen.files, deleted)


def module_sources(files: Mapping[str, str], cache: ParseCache) -> dict[str, str]:
    """Module call name → local source directory, for mapping changed module files to calls."""
    from analyzer.hcl import analyze_file

    found: dict[str, str] = {}
    for name, text in files.items():
        if not any(h.type == "module" for h in scan(text).headers):
            continue
        for block in analyze_file(name, text, cache=cache).blocks:
            if block.type == "module" and block.module_source and block.module_source.startswith(("./", "../")):
                found[block.labels[0]] = str(Path(block.module_source).as_posix()).lstrip("./") \
                    if block.module_source.startswith("./") else block.module_source
    return found
