"""``kl plan``: plan a configuration against a trunk snapshot in a private workspace and write
kl-plan.json — the write set, the read set, the reservations to take, and what each address does.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.configuration import described_resources, is_described, orphans
from analyzer.globs import Glob, canonical, matches, parse_glob
from analyzer.plan import PlanAnalysis, PlanFormatError, analyze_plan
from analyzer.plan_drift import drift_in_plan, drift_warnings
from analyzer.rewrites import rewritten_rows
from analyzer.state import ParsedState, parse_state
from analyzer.state_assembly import assemble_state
from runner.core import workspace
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import EngineCode, Failed, InvalidInput
from runner.core.spec import PinKind, PinnedVar, PlanMode, PlanSpec
from runner.core.terraform import TerraformBinary, TerraformError, run

PLAN_FILE = "kl.tfplan"


@dataclass(frozen=True, slots=True)
class TerraformContext:
    """How to run Terraform for one command."""

    binary: TerraformBinary
    env: Mapping[str, str]
    plugin_cache: Path
    echo: Callable[[str], None]
    stream: bool = True
    stop: threading.Event | None = None  # set: interrupt the running Terraform command (an abort)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The trunk as the rows hold it (None when the state has no versions yet)."""

    raw: bytes | None
    parsed: ParsedState | None

    @property
    def serial(self) -> int:
        return self.parsed.serial if self.parsed else 0

    @property
    def lineage(self) -> str | None:
        return self.parsed.lineage if self.parsed else None

    @property
    def addresses(self) -> list[str]:
        """The instance addresses it holds, sorted, each once (deposed objects share theirs)."""
        return sorted({r.address for r in self.parsed.instances}) if self.parsed else []


def fetch_snapshot(client: EngineClient, state: str, serial: int | None = None) -> Snapshot:
    """The trunk at its head, or as it was at ``serial``."""
    return _fetch(state, lambda: client.assembled(state, serial=serial))


def fetch_rows(client: EngineClient, state: str, globs: Sequence[str]) -> Snapshot:
    """The trunk's rows under ``globs`` (and the outputs), as the server slices them."""
    return _fetch(state, lambda: client.slice(state, list(globs)))


def _fetch(state: str, read: Callable[[], bytes]) -> Snapshot:
    try:
        raw = read()
    except EngineError as exc:
        if exc.code == EngineCode.STATE_NOT_FOUND:
            return Snapshot(None, None)
        raise
    parsed = parse_state(raw)
    if not isinstance(parsed, ParsedState):
        raise InvalidInput(f"state {state!r} is encrypted (OpenTofu state encryption): kl cannot slice it")
    return Snapshot(raw, parsed)


def described_part(snapshot: Snapshot, described: frozenset[str]) -> Snapshot:
    """The snapshot's instances the workspace's configuration describes (``is_described``), with the
    outputs, re-assembled as a state file: what a workspace starts from."""
    parsed = snapshot.parsed
    if parsed is None:
        return snapshot
    rows = tuple(r for r in parsed.instances if is_described(r.address, described))
    raw = assemble_state(serial=parsed.serial, lineage=parsed.lineage, terraform_version=parsed.terraform_version,
                         instances=rows, outputs=parsed.outputs)
    return Snapshot(raw, ParsedState(parsed.serial, parsed.lineage, parsed.terraform_version, rows, parsed.outputs))


def terraform(ctx: TerraformContext, ws: workspace.Workspace, args: Sequence[str], *, quiet: bool = False,
              ok: tuple[int, ...] = (0,)) -> str:
    """Run one Terraform command in the workspace, streaming its output unless quiet."""
    def forward(_: str, line: str) -> None:
        ctx.echo("  │ " + line.rstrip("\n"))

    env = workspace.terraform_env(ctx.env, ctx.plugin_cache)
    try:
        result = run(ctx.binary, ["-chdir=" + str(ws.path), *args], cwd=ws.path, env=env,
                     stream=None if quiet or not ctx.stream else forward, stop=ctx.stop)
        result.check(ok_codes=ok)
    except TerraformError as exc:
        raise Failed(f"terraform {args[0]} failed (exit {exc.exit_code}):\n{exc.stderr_tail}") from exc
    return result.stdout


def init(ctx: TerraformContext, ws: workspace.Workspace) -> None:
    cache = workspace.plugin_cache(ctx.env, ctx.plugin_cache)
    with workspace.plugin_cache_lock(cache, exclusive=workspace.may_install_providers(ws, cache)):
        terraform(ctx, ws, ["init", "-input=false", "-no-color"], quiet=True)


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


AUTO_VAR_NAMES = ("terraform.tfvars", "terraform.tfvars.json")


def auto_var_files(config_dir: Path) -> list[Path]:
    """The variable-definitions files Terraform loads by itself, in its order: ``terraform.tfvars``,
    ``terraform.tfvars.json``, then ``*.auto.tfvars`` and ``*.auto.tfvars.json`` in lexical order of their names."""
    if not config_dir.is_dir():
        return []
    present = {p.name: p for p in config_dir.iterdir() if p.is_file()}
    fixed = [present[n] for n in AUTO_VAR_NAMES if n in present]
    auto = [present[n] for n in sorted(present) if n.endswith((".auto.tfvars", ".auto.tfvars.json"))]
    return fixed + auto


def pin_variables(
    var_args: Sequence[tuple[str, str]], env: Mapping[str, str], sensitive: frozenset[str],
    config_dir: Path | None = None,
) -> tuple[PinnedVar, ...]:
    """Record every input the plan used: the variable-definitions files Terraform loads by itself (content
    hashes), -var values (hash only when sensitive), -var-file paths with content hashes, and TF_VAR_
    variables (hash only). Terraform's precedence among them is its own: kl passes them on unchanged."""
    pinned: list[PinnedVar] = []
    for path in auto_var_files(config_dir) if config_dir is not None else ():
        pinned.append(PinnedVar(PinKind.AUTO_VAR_FILE, str(path.resolve()), workspace.file_hash(path)))
    for kind, raw in var_args:
        if kind == "var":
            name, _, value = raw.partition("=")
            digest = hashlib.sha256(value.encode()).hexdigest()
            pinned.append(PinnedVar(PinKind.VAR, name, digest, None if name in sensitive else value))
        else:
            path = Path(raw).resolve()
            if not path.is_file():
                raise InvalidInput(f"-var-file {raw}: no such file")
            pinned.append(PinnedVar(PinKind.VAR_FILE, str(path), workspace.file_hash(path)))
    for key in sorted(k for k in env if k.startswith("TF_VAR_")):
        pinned.append(PinnedVar(PinKind.ENV, key, hashlib.sha256(env[key].encode()).hexdigest()))
    return tuple(pinned)


def sensitive_variables(plan: Mapping[str, Any]) -> frozenset[str]:
    root = plan.get("configuration", {}).get("root_module", {})
    return frozenset(name for name, var in (root.get("variables") or {}).items() if var.get("sensitive"))


def plan_in_workspace(
    ctx: TerraformContext, ws: workspace.Workspace, flags: Sequence[str], targets: Sequence[str],
    *, refresh: bool = False,
) -> dict[str, Any]:
    """init, plan -out, show -json; returns the plan JSON. Plans do not refresh unless asked (kl plan
    --refresh): Kilolock plans against the trunk as recorded (see docs/parallel-apply.md, docs/drift.md)."""
    init(ctx, ws)
    terraform(ctx, ws, ["plan", "-input=false", "-lock=false", *([] if refresh else ["-refresh=false"]), "-no-color",
                        f"-out={PLAN_FILE}", *flags, *(f"-target={t}" for t in targets)], quiet=True)
    return show_plan(ctx, ws)


def show_plan(ctx: TerraformContext, ws: workspace.Workspace) -> dict[str, Any]:
    """``terraform show -json`` of the workspace's saved plan, as a JSON object."""
    shown = terraform(ctx, ws, ["show", "-json", PLAN_FILE], quiet=True)
    try:
        doc = json.loads(shown)
    except ValueError as exc:
        raise Failed("terraform show -json did not print JSON") from exc
    if not isinstance(doc, dict):
        raise Failed("terraform show -json did not print a plan object")
    return doc


def state_edges(snapshot: Snapshot) -> tuple[list[tuple[str, str]], list[str]]:
    if snapshot.parsed is None:
        return [], []
    edges = [(row.address, dep) for row in snapshot.parsed.instances for dep in row.dependencies]
    return edges, [row.address for row in snapshot.parsed.instances]


def make_plan(
    client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path,
    var_args: Sequence[tuple[str, str]], targets: Sequence[str], refresh: bool = False,
) -> PlanSpec:
    """Plan ``config_dir`` against the trunk and describe the result as a PlanSpec."""
    snapshot = fetch_snapshot(client, state)
    with tempfile.TemporaryDirectory(prefix="kl-plan-") as tmp:
        ws = workspace.build(config_dir, Path(tmp) / "ws", snapshot.raw)
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
            config_hash=workspace.config_hash(config_dir), write_set=write_set,
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
class PlannedChanges:
    """What a plan changes and reserves, as the planner that made it worked it out."""

    config_hash: str  # empty for a file-scoped plan, whose files are pinned one by one instead
    write_set: tuple[str, ...]
    read_set: tuple[str, ...]
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    described: tuple[str, ...]
    warnings: tuple[str, ...]
    output_changes: dict[str, str]
    left_alone: tuple[str, ...] = ()  # trunk instances the configuration has no block for


def spec_from_plan(source: PlanSource, changes: PlannedChanges) -> PlanSpec:
    """The kl-plan.json of a plan over ``source.snapshot``: where and when it was made, its sets and
    reservations, each written address's action, and every input it used (file-scoped plans add their
    fields to it)."""
    snapshot, analysis = source.snapshot, source.analysis
    return PlanSpec(
        state=source.state, address=source.address, lineage=snapshot.lineage, base_serial=snapshot.serial,
        terraform_version=analysis.terraform_version, config_dir=str(source.config_dir.resolve()),
        config_hash=changes.config_hash, created_at=datetime.now(UTC).isoformat(),
        write_set=changes.write_set, read_set=changes.read_set, write_globs=changes.write_globs,
        read_globs=changes.read_globs,
        actions={c.address: c.summary for c in analysis.changes if c.address in changes.write_set},
        described_resources=changes.described, orphans=changes.left_alone, warnings=changes.warnings,
        variables=pin_variables(source.var_args, source.env, sensitive_variables(source.plan), source.config_dir),
        targets=source.targets, output_changes=changes.output_changes, refresh=source.refresh,
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
