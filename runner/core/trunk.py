"""The trunk stage: what the server's rows hold, read as a state — the whole trunk (at its head or at a
serial), the rows under a set of globs (a slice), the part of either a workspace's configuration
describes, and the dependency edges the rows record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from analyzer.configuration import is_described
from analyzer.state import ParsedState, parse_state
from analyzer.state_assembly import assemble_state
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import EngineCode, InvalidInput


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


def fetch_slice(client: EngineClient, state: str, globs: Sequence[str],
                described: frozenset[str]) -> tuple[bytes | None, list[str], Snapshot]:
    """The trunk rows under ``globs`` that the workspace describes, as a state file, their addresses, and the
    slice as fetched."""
    snapshot = fetch_rows(client, state, globs)
    part = described_part(snapshot, described)
    return part.raw, part.addresses, snapshot


def state_edges(snapshot: Snapshot) -> tuple[list[tuple[str, str]], list[str]]:
    """The (instance, resource it depends on) pairs the trunk's rows record, and the instance addresses."""
    if snapshot.parsed is None:
        return [], []
    edges = [(row.address, dep) for row in snapshot.parsed.instances for dep in row.dependencies]
    return edges, [row.address for row in snapshot.parsed.instances]
