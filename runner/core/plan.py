"""``kl plan``: plan a configuration against a trunk snapshot in a private workspace and write
kl-plan.json — the write set, the read set, the reservations to take, and what each address does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.configuration import described_resources, orphans
from analyzer.globs import Glob, canonical, matches, parse_glob
from analyzer.plan import PlanAnalysis, PlanFormatError, analyze_plan
from analyzer.plan_drift import drift_in_plan, drift_warnings
from analyzer.rewrites import rewritten_rows
from analyzer.state import ParsedState, parse_state
from runner.core import pins, workbuild
from runner.core.engine_client import EngineClient
from runner.core.errors import Failed
from runner.core.pins import pin_variables
from runner.core.session import TerraformContext, plan_in_workspace
from runner.core.spec import PinKind, PinnedVar, PlanMode, PlanSpec
from runner.core.trunk import Snapshot, fetch_snapshot, state_edges


def given_var_flags(var_args: Sequence[tuple[str, str]], declared: Container[str] | None = None) -> list[str]:
    """``-var`` and ``-var-file`` flags as given (a file's path made absolute: Terraform runs in the workspace).
    With ``declared``, a -var for a variable not in it is left out: nothing in the workspace reads it, and
    Terraform rejects -var for an undeclared variable."""
    flags: list[str] = []
    for kind, raw in var_args:
        if kind != "var":
            flags.append(f"-var-file={Path(raw).resolve()}")
        elif declared is None or raw.partition("=")[0].strip() in declared:
            flags.append(f"-var={raw}")
    return flags


def var_flags(variables: Sequence[PinnedVar], supplied: Mapping[str, str]) -> list[str]:
    """Terraform flags for pinned inputs; sensitive values come from ``supplied`` (name → value)."""
    flags: list[str] = []
    for var in variables:
        if var.kind == PinKind.VAR:
            value = var.value if var.value is not None else supplied.get(var.name)
            flags.append(f"-var={var.name}={value}")
        elif var.kind == PinKind.VAR_FILE:
            flags.append(f"-var-file={var.name}")
    return flags


def sensitive_variables(plan: Mapping[str, Any]) -> frozenset[str]:
    root = plan.get("configuration", {}).get("root_module", {})
    return frozenset(name for name, var in (root.get("variables") or {}).items() if var.get("sensitive"))


def make_plan(
    client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path,
    var_args: Sequence[tuple[str, str]], targets: Sequence[str], refresh: bool = False,
) -> PlanSpec:
    """Plan ``config_dir`` against the trunk and describe the result as a PlanSpec."""
    snapshot = fetch_snapshot(client, state)
    with tempfile.TemporaryDirectory(prefix="kl-plan-") as tmp:
        ws = workbuild.build(config_dir, Path(tmp) / "ws", snapshot.raw)
        plan = plan_in_workspace(ctx, ws, given_var_flags(var_args), targets, refresh=refresh)
    described = described_resources(plan)
    edges, addresses = state_edges(snapshot)
    try:
        analysis = analyze_plan(plan, state_edges=edges, state_addresses=addresses)
    except PlanFormatError as exc:
        raise Failed(f"cannot read Terraform's plan: {exc}") from exc
    left_alone = orphans(plan.get("resource_changes", []), described)
    warnings = list(analysis.warnings) + (drift_warnings(drift_in_plan(plan)) if refresh else [])
    if left_alone:
        warnings.append(
            f"{len(left_alone)} trunk instance(s) have no resource block in this configuration and are left "
            f"alone (another change may own them): {', '.join(sorted(left_alone)[:10])}"
        )
    rewritten = incidental_writes(plan, snapshot.raw, analysis.write_globs) - left_alone
    write_set = tuple(sorted((analysis.write_set | rewritten) - left_alone))
    output_changes = changed_outputs(analysis)
    return spec_from_plan(
        PlanSource(address=client.config.base_url, state=state, config_dir=config_dir, snapshot=snapshot, plan=plan,
                   analysis=analysis, var_args=tuple(var_args), env=ctx.env, refresh=refresh,
                   targets=tuple(targets)),
        PlannedChanges(
            write_set=write_set,
            read_set=tuple(sorted(analysis.read_set - left_alone)),
            write_globs=tuple(sorted((set(analysis.write_globs) - left_alone) | output_write_globs(output_changes)
                                     | {canonical(Glob.exact(a)) for a in rewritten})),
            read_globs=tuple(analysis.read_globs), described=tuple(sorted(described)), warnings=tuple(warnings),
            output_changes=output_changes, left_alone=tuple(sorted(left_alone))),
    )


def incidental_writes(plan: Mapping[str, Any], slice_raw: bytes | None, write_globs: Sequence[str]
                      ) -> frozenset[str]:
    """The rows an apply of ``plan`` rewrites without a planned change (``analyzer.rewrites``: dependencies a
    ``moved`` block renames, data sources the commit takes), against the workspace's starting state."""
    parsed = parse_state(slice_raw) if slice_raw else None
    rows = {r.address: r for r in parsed.instances if not r.deposed} if isinstance(parsed, ParsedState) else {}
    globs = [parse_glob(g) for g in write_globs if not g.startswith("output.")]
    return rewritten_rows(plan, rows, lambda address: any(matches(g, address) for g in globs))


def changed_outputs(analysis: PlanAnalysis, ignored: frozenset[tuple[str, ...]] = frozenset({("no-op",)})
                    ) -> dict[str, str]:
    """Root output name → its actions (``create``, ``delete-create`` …), without those in ``ignored``."""
    return {name: "-".join(actions) for name, actions in analysis.output_changes.items()
            if tuple(actions) not in ignored}


@dataclass(frozen=True, slots=True)
class PlanSource:
    """Where a plan was made: the server and state, the configuration, the trunk snapshot it was made over,
    Terraform's plan of it and that plan's analysis, and the inputs it was given."""

    address: str  # the server's base URL
    state: str
    config_dir: Path
    snapshot: Snapshot
    plan: Mapping[str, Any]
    analysis: PlanAnalysis
    var_args: tuple[tuple[str, str], ...]  # ("var" | "var-file", text) as given
    env: Mapping[str, str]  # the process environment (its TF_VAR_ variables are pinned)
    refresh: bool = False
    targets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FileScopedPart:
    """What a file-scoped plan (kl plan -f) adds to its plan file: the selected files and the variables whose
    values changed, the files its workspace was cut from with their hashes (the plan's pin of its
    configuration, ``pins.pin_files``), what the change deleted (the old texts' hashes, the globs they
    declared, the root outputs whose blocks went), the validation and slice globs, and the footprint's
    diagnostics. Each field is the plan file's field of the same name."""

    selected_files: tuple[str, ...]
    files: dict[str, str]
    seed_variables: tuple[str, ...]
    deleted_files: dict[str, str]
    deleted_globs: tuple[str, ...]
    validation_globs: tuple[str, ...]
    slice_globs: tuple[str, ...]
    diagnostics: tuple[dict[str, Any], ...]
    removed_outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlannedChanges:
    """What a plan changes and reserves, as the planner that made it worked it out; ``scoped`` is a
    file-scoped plan's own part (None: a plan of the whole configuration)."""

    write_set: tuple[str, ...]
    read_set: tuple[str, ...]
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    described: tuple[str, ...]
    warnings: tuple[str, ...]
    output_changes: dict[str, str]
    left_alone: tuple[str, ...] = ()  # trunk instances the configuration has no block for
    scoped: FileScopedPart | None = None


def spec_from_plan(source: PlanSource, changes: PlannedChanges) -> PlanSpec:
    """The kl-plan.json of a plan over ``source.snapshot``: where and when it was made, its sets and
    reservations, each written address's action, and every input it used. A plan pins its configuration by
    its mode: a full plan by the whole configuration's hash, a file-scoped one by its files (``changes.scoped``)."""
    snapshot, analysis, scoped = source.snapshot, source.analysis, changes.scoped
    return PlanSpec(
        state=source.state, address=source.address, lineage=snapshot.lineage, base_serial=snapshot.serial,
        terraform_version=analysis.terraform_version, config_dir=str(source.config_dir.resolve()),
        config_hash="" if scoped else pins.config_hash(source.config_dir), created_at=datetime.now(UTC).isoformat(),
        write_set=changes.write_set, read_set=changes.read_set, write_globs=changes.write_globs,
        read_globs=changes.read_globs,
        actions={c.address: c.summary for c in analysis.changes if c.address in changes.write_set},
        described_resources=changes.described, orphans=changes.left_alone, warnings=changes.warnings,
        variables=pin_variables(source.var_args, source.env, sensitive_variables(source.plan), source.config_dir),
        targets=source.targets, output_changes=changes.output_changes, refresh=source.refresh,
        mode=PlanMode.FULL if scoped is None else PlanMode.FILES,
        **({f.name: getattr(scoped, f.name) for f in fields(scoped)} if scoped else {}),
    )


def output_write_globs(output_changes: Mapping[str, str]) -> set[str]:
    """Write reservations for the root outputs a plan adds, changes or removes: the server refuses a
    commit that changes an output no write glob covers. A name that is not an identifier (Terraform
    never prints one) widens to ``output.*``."""
    found: set[str] = set()
    for name in output_changes:
        try:
            found.add(canonical(Glob.root_output(name)))
        except ValueError:
            found.add(canonical(Glob.all_outputs()))
    return found


def summary(spec: PlanSpec) -> str:
    """The readable account kl plan prints."""
    lines = [f"kl plan: state {spec.state!r} at serial {spec.base_serial}"]
    if spec.mode == PlanMode.FILES:
        lines.append("File-scoped: " + ", ".join(spec.selected_files or ("(deleted files only)",)))
        # deleted_files also holds the earlier text of each changed file ("NAME@REF"), whose blocks are
        # reserved in case they were removed; only files that are really gone are named here.
        gone = sorted(name for name in spec.deleted_files if "@" not in name)
        if gone:
            lines.append("Deleted files (what they declared is planned for destruction): " + ", ".join(gone))
    if not spec.write_set and not spec.output_changes:
        lines.append("No changes: nothing to apply, so kl apply would take no reservations.")
        lines += [f"warning: {w}" for w in spec.warnings]
        return "\n".join(lines)
    counts: dict[str, int] = {}
    for action in spec.actions.values():
        counts[action] = counts.get(action, 0) + 1
    if counts:
        lines.append("Changes: " + ", ".join(f"{n} to {a}" for a, n in sorted(counts.items())))
        lines += [f"  {action:<8} {address}" for address, action in sorted(spec.actions.items())]
    if spec.output_changes:
        lines.append("Outputs: " + ", ".join(f"{n} ({a})" for n, a in sorted(spec.output_changes.items())))
    lines.append("Reservations kl apply will take:")
    lines += [f"  write {g}" for g in spec.write_globs] or ["  (none to write)"]
    lines += [f"  read  {g}" for g in spec.read_globs]
    lines += [f"warning: {w}" for w in spec.warnings]
    return "\n".join(lines)
