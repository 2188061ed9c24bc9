"""Address scopes of a token: which addresses it may read and which it may write, and the checks on them.

A scope is ``GLOB:MODE`` (``module.payments.*:write``, ``output.payments_url:write``, ``*:read``); write
implies read. A token with no scopes has the whole state, as before scopes existed (``ScopeSet`` is then
``None`` on the principal, never an empty set). Every check compares parsed globs with
``analyzer.globs.covers``, the conflict matrix's containment, never text: a request for a glob is allowed
when one scope of at least its mode covers the glob; a written address or output is allowed when a write
scope matches it.

Must not do I/O. The store and the views call these rules and raise ``AddressScopeError`` (403
``address_scope``) with the refused glob and the nearest scope; the web layer audits it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.globs import Glob, GlobError, canonical, covers, matches, matches_output, parse_glob
from app.domain.globindex import GlobIndex
from app.domain.reservations import Mode
from app.errors import AddressScopeError

__all__ = [
    "MAX_SCOPES",
    "PLAN_ONLY",
    "AddressScope",
    "ScopeError",
    "ScopeSet",
    "can_read",
    "can_read_output",
    "can_read_resource",
    "can_see_reservation",
    "check_readable",
    "check_requested",
    "check_whole_state",
    "check_written",
    "parse_scope",
    "parse_scopes",
    "readable_event",
    "scope_set",
]

# A token's scopes are read on every request it makes; this bounds the list (and the work per check).
MAX_SCOPES = 1000
MAX_SCOPE_TEXT = 2000
# The preset of ``kl tokens create --plan-only``: read everything, write nothing.
PLAN_ONLY = ("*:read",)
_EVERYTHING = parse_glob("*")


class ScopeError(ValueError):
    """A scope that cannot be parsed; the message names it and the accepted form."""


@dataclass(frozen=True, slots=True)
class AddressScope:
    glob: Glob
    mode: Mode

    def __str__(self) -> str:
        return f"{canonical(self.glob)}:{self.mode.value}"

    def allows(self, mode: Mode) -> bool:
        return self.mode is Mode.WRITE or mode is Mode.READ


def parse_scope(text: str) -> AddressScope:
    """``GLOB:MODE``; the mode is after the last ``:``, so quoted keys may hold colons."""
    if not isinstance(text, str) or len(text) > MAX_SCOPE_TEXT:
        raise ScopeError(f"a scope is a string 'GLOB:read' or 'GLOB:write' of at most {MAX_SCOPE_TEXT} characters")
    glob_text, sep, mode_text = text.rpartition(":")
    if not sep or mode_text not in (Mode.READ.value, Mode.WRITE.value):
        raise ScopeError(f"invalid scope {text!r}: write GLOB:read or GLOB:write, e.g. 'module.payments.*:write'")
    try:
        glob = parse_glob(glob_text)
    except GlobError as exc:
        raise ScopeError(f"invalid scope {text!r}: {exc}") from exc
    return AddressScope(glob, Mode(mode_text))


def parse_scopes(items: Iterable[object]) -> tuple[str, ...]:
    """Validate scopes from a request or the command line: their canonical texts, sorted, duplicates and
    a read already implied by a write of the same glob dropped. Raises ScopeError naming the bad one."""
    found: dict[str, AddressScope] = {}
    for count, item in enumerate(items, start=1):
        if count > MAX_SCOPES:
            raise ScopeError(f"a token has at most {MAX_SCOPES} scopes: use module or type globs")
        if not isinstance(item, str):
            raise ScopeError("scopes must be strings 'GLOB:read' or 'GLOB:write'")
        scope = parse_scope(item)
        key = canonical(scope.glob)
        if key not in found or scope.mode is Mode.WRITE:
            found[key] = scope
    return tuple(sorted(str(s) for s in found.values()))


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a refused check names: the glob or address asked for, the mode, and the nearest scope."""

    glob: str
    mode: Mode
    nearest: str


class ScopeSet:
    """A token's parsed scopes, indexed: a check walks only the scopes that meet the glob (``GlobIndex``),
    so 200 scopes cost about as much as one. Built once per distinct list (``scope_set``)."""

    __slots__ = ("_read", "_write", "scopes")

    def __init__(self, scopes: tuple[AddressScope, ...]) -> None:
        self.scopes = scopes
        self._read = GlobIndex((s.glob, s) for s in scopes)
        self._write = GlobIndex((s.glob, s) for s in scopes if s.mode is Mode.WRITE)

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(str(s) for s in self.scopes)

    def allows(self, glob: Glob, mode: Mode) -> bool:
        """Whether one scope of at least ``mode`` covers every address ``glob`` covers."""
        index = self._write if mode is Mode.WRITE else self._read
        return any(covers(held, glob) for held, _ in index.meeting(glob))

    def allows_address(self, address: str, mode: Mode) -> bool:
        """Whether a scope of at least ``mode`` matches the instance address (False when it does not parse)."""
        try:
            parsed = parse_instance_address(address)
        except AddressError:
            return False
        index = self._write if mode is Mode.WRITE else self._read
        return any(matches(held, parsed) for held, _ in index.meeting(Glob.exact(parsed)))

    def allows_output(self, name: str, mode: Mode) -> bool:
        index = self._write if mode is Mode.WRITE else self._read
        return any(matches_output(held, name) for held, _ in index.meeting(Glob.root_output(name)))

    def touches(self, glob: Glob) -> bool:
        """Whether some address of ``glob`` is readable (a read or write scope meets it)."""
        return self._read.any_meeting(glob)

    @property
    def reads_everything(self) -> bool:
        return self.allows(_EVERYTHING, Mode.READ)

    def refusal(self, glob: Glob, mode: Mode) -> Refusal | None:
        """None when allowed, else what to tell the caller."""
        if self.allows(glob, mode):
            return None
        return Refusal(canonical(glob), mode, self.nearest(glob, mode))

    def nearest(self, glob: Glob, mode: Mode) -> str:
        """The scope to name beside a refusal: one that meets the glob — preferring one that covers it (in a
        lower mode), then one of the wanted mode — else the first scope ("" for none)."""
        met = sorted((s for _, s in self._read.meeting(glob)),
                     key=lambda s: (not covers(s.glob, glob), not s.allows(mode), str(s)))
        if met:
            return str(met[0])
        return str(self.scopes[0]) if self.scopes else ""

    def first_unwritable(self, addresses: Iterable[str], outputs: Iterable[str]) -> Refusal | None:
        """The first written address or root output no write scope matches, or None."""
        for address in addresses:
            if not self.allows_address(address, Mode.WRITE):
                return Refusal(address, Mode.WRITE, self.nearest(_exact_or_everything(address), Mode.WRITE))
        for name in outputs:
            if not self.allows_output(name, Mode.WRITE):
                return Refusal(f"output.{name}", Mode.WRITE, self.nearest(Glob.root_output(name), Mode.WRITE))
        return None

    def readable_detail(self, detail: Mapping[str, Any]) -> bool:
        """Whether every address or glob an audit event's detail names is readable (an event naming none is)."""
        return all(self._readable_text(text) for text in _named(detail))

    def _readable_text(self, text: str) -> bool:
        try:
            glob = parse_glob(text)
        except GlobError:
            return False
        if glob.is_exact:
            return self.allows_address(text, Mode.READ)
        return self.allows(glob, Mode.READ)


def _exact_or_everything(address: str) -> Glob:
    try:
        return Glob.exact(address)
    except AddressError:
        return _EVERYTHING


# Detail keys of audit events that hold addresses or globs (as text, lists, or objects with "glob").
_ADDRESS_KEYS = frozenset({"addresses", "address", "globs", "glob", "wanted", "wanted_more", "globs_more",
                           "conflicts", "conflicts_more", "drifted", "checked", "reservations"})


def _named(detail: Mapping[str, Any]) -> Iterable[str]:
    for key, value in detail.items():
        if key in _ADDRESS_KEYS:
            yield from _texts(value)


def _texts(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, Mapping):
        for key in ("glob", "address", "held", "wanted"):
            if key in value:
                yield from _texts(value[key])


@lru_cache(maxsize=1024)
def scope_set(texts: tuple[str, ...]) -> ScopeSet | None:
    """The parsed set of stored scope texts; None for no scopes (the whole state). Cached: a token's scopes
    are parsed once, not on each of its requests. Raises ScopeError for a stored scope that no longer parses."""
    if not texts:
        return None
    return ScopeSet(tuple(parse_scope(t) for t in texts))


def _refused(state: str, refusal: Refusal, what: str) -> AddressScopeError:
    nearest = f"the nearest scope it has is {refusal.nearest!r}" if refusal.nearest else "it has no scope near it"
    return AddressScopeError(
        f"this token's address scopes do not allow {what} {refusal.glob!r} ({refusal.mode.value}) on state "
        f"{state!r}; {nearest}: ask an operator to widen its scopes (kl tokens scopes), or use a token that owns "
        "these addresses",
        glob=refusal.glob, mode=refusal.mode.value, nearest_scope=refusal.nearest, state=state)


def check_requested(scopes: ScopeSet | None, state: str, wanted: Iterable[tuple[Glob, Mode]]) -> None:
    """Every requested reservation needs a scope of at least its mode covering its glob; raises
    AddressScopeError naming the first that has none. No scopes: the whole state, nothing to check."""
    if scopes is None:
        return
    for glob, mode in wanted:
        refusal = scopes.refusal(glob, mode)
        if refusal is not None:
            raise _refused(state, refusal, "reserving")


def check_whole_state(scopes: ScopeSet | None, state: str, mode: Mode, what: str) -> None:
    """Whole-state operations (Terraform's LOCK, POST, DELETE and GET) need ``*`` at ``mode``."""
    if scopes is None:
        return
    refusal = scopes.refusal(_EVERYTHING, mode)
    if refusal is not None:
        raise _refused(state, refusal, what + " of")


def check_written(scopes: ScopeSet | None, state: str, addresses: Iterable[str], outputs: Iterable[str]) -> None:
    """A commit's written addresses and root outputs must each lie inside a write scope, whatever its
    reservations cover."""
    if scopes is None:
        return
    refusal = scopes.first_unwritable(addresses, outputs)
    if refusal is not None:
        raise _refused(state, refusal, "writing")


def can_read(scopes: ScopeSet | None, address: str) -> bool:
    """Whether the instance address is readable (every address is, without scopes)."""
    return scopes is None or scopes.allows_address(address, Mode.READ)


def can_read_output(scopes: ScopeSet | None, name: str) -> bool:
    return scopes is None or scopes.allows_output(name, Mode.READ)


def can_read_resource(scopes: ScopeSet | None, resource_address: str) -> bool:
    """Whether some instance of a resource (an address without its key, as dependencies name them) is
    readable; False for text that does not parse."""
    if scopes is None:
        return True
    try:
        return scopes.touches(parse_glob(resource_address + ".*"))
    except GlobError:
        return scopes.allows_address(resource_address, Mode.READ)


def can_see_reservation(scopes: ScopeSet | None, glob_text: str) -> bool:
    """Whether a reservation (or a Terraform lock's ``*``) is shown to the token: its glob meets a read
    scope, so it is what may block the token's own requests; False for text that does not parse."""
    if scopes is None:
        return True
    try:
        return scopes.touches(parse_glob(glob_text))
    except GlobError:
        return False


def check_readable(scopes: ScopeSet | None, state: str, address: str) -> None:
    """One named instance address must be readable (a resource's history)."""
    if scopes is None or can_read(scopes, address):
        return
    raise _refused(state, Refusal(address, Mode.READ, scopes.nearest(_exact_or_everything(address), Mode.READ)),
                   "reading")


def readable_event(scopes: ScopeSet | None, detail: Mapping[str, Any]) -> bool:
    """Whether an audit event may be shown: every address or glob it names is readable."""
    return scopes is None or scopes.reads_everything or scopes.readable_detail(detail)
