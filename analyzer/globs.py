"""Reservation globs: which instance addresses a reservation covers, and when two reservations conflict.

Owns ``matches``, ``matches_output``, ``intersects``, ``covers``, the read/write conflict matrix and the
reservation as its text travels (``Reservation``, ``Mode``). The glob grammar (``*``, an exact instance address,
a module, resource or type prefix followed by ``.*``, a root output) and its canonical text are
``analyzer.glob_grammar``, whose names (``Glob``, ``parse_glob``, ``canonical``…) this module re-exports.

Root outputs. Outputs are not instances, so output globs live in their own space: ``output.NAME`` covers
one root output, ``output.PREFIX*`` every root output whose name starts with PREFIX (``output.payments_*``:
output names are single identifiers, so a name prefix is the one partial-name wildcard; resource and
module names have none), ``output.*`` every root output, ``*`` covers outputs too (it is Terraform's whole-state
LOCK), and no resource, module or exact glob ever intersects an output glob. Output names are
identifiers, so ``output.x`` is always an output: a root resource of type ``output`` cannot be named by
an exact or resource glob (only ``*`` covers it), which is the wide side of the ambiguity.

Must not do I/O or compare addresses as raw strings: every comparison goes through parsed steps from
``analyzer.addresses``, because ``module.web`` is a string prefix of ``module.webapp``.

Keyless module steps. In a prefix glob (``module.web.*``, ``module.a.module.b.*``,
``module.x.aws_instance.web.*``) every module step written without an instance key means "any key of
that module call, or none": ``module.web.*`` covers ``module.web.x.y``, ``module.web[0].x.y`` and
``module.web["a"].x.y``, and ``module.a.module.b.*`` covers ``module.a["k"].module.b.x.y`` too. This is
wider than Terraform's ``-target`` rule (where only the last step may omit its key) on purpose: a
reservation that covers too much costs some parallelism, one that covers too little lets two applies
write the same instance. A step written with a key (``module.net["a"].*``) covers that instance only.
An exact glob is one address, so there a keyless step means "no key", as in Terraform.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from analyzer.addresses import InstanceAddress, ModuleStep
from analyzer.glob_grammar import Glob, GlobError, GlobKind, as_address, canonical, parse_glob

__all__ = [
    "READ",
    "WRITE",
    "Glob",
    "GlobError",
    "GlobKind",
    "Mode",
    "Reservation",
    "canonical",
    "conflicts",
    "covers",
    "footprint_reservations",
    "intersects",
    "matches",
    "matches_output",
    "parse_glob",
    "stored_glob",
    "texts_conflict",
]


class Mode(StrEnum):
    """A reservation's mode. A StrEnum, so it is its own text in JSON, in the database and in comparisons."""

    READ = "read"
    WRITE = "write"


READ = Mode.READ
WRITE = Mode.WRITE
_MODES = (READ, WRITE)


@dataclass(frozen=True, slots=True, order=True)
class Reservation:
    """One reservation as its text travels: a glob as written and its mode (plan files, request bodies,
    the engine's answers, the rows a run holds). Orders by (glob, mode)."""

    glob: str
    mode: Mode

    @classmethod
    def of(cls, glob: object, mode: object) -> Reservation:
        """From untyped input (a JSON object's fields, a database row); ValueError on a mode that is
        neither read nor write."""
        try:
            return cls(str(glob), Mode(str(mode)))
        except ValueError as exc:
            raise ValueError(f"unknown reservation mode {mode!r}: use 'read' or 'write'") from exc

    def to_json(self) -> dict[str, str]:
        return {"glob": self.glob, "mode": str(self.mode)}


def footprint_reservations(write_globs: Iterable[str], read_globs: Iterable[str]) -> tuple[Reservation, ...]:
    """The reservations of a footprint: its write globs, then its read globs, in their given order."""
    return tuple(Reservation(g, WRITE) for g in write_globs) + tuple(Reservation(g, READ) for g in read_globs)


def matches(glob: Glob, address: str | InstanceAddress) -> bool:
    """Whether ``glob`` covers the instance ``address``; raises AddressError if the text does not parse."""
    target = as_address(address)
    if glob.kind is GlobKind.EVERYTHING:
        return True
    if glob.is_output:
        return False
    if glob.kind is GlobKind.EXACT:
        return glob.address == target
    if glob.kind is GlobKind.MODULE:
        return len(target.module) >= len(glob.module) and _steps_cover(glob.module, target.module)
    if glob.kind is GlobKind.TYPE:
        return (
            glob.resource_type == (target.mode, target.type)
            and len(target.module) == len(glob.module)
            and _steps_cover(glob.module, target.module)
        )
    return (
        glob.resource == (target.mode, target.type, target.name)
        and len(target.module) == len(glob.module)
        and _steps_cover(glob.module, target.module)
    )


def matches_output(glob: Glob, name: str) -> bool:
    """Whether ``glob`` covers the root output ``name``: ``*``, ``output.*``, ``output.NAME`` and an
    ``output.PREFIX*`` whose prefix starts the name do."""
    if glob.kind in (GlobKind.EVERYTHING, GlobKind.OUTPUTS):
        return True
    if glob.kind is GlobKind.OUTPUT_PREFIX:
        return name.startswith(str(glob.output))
    return glob.kind is GlobKind.OUTPUT and glob.output == name


def intersects(a: Glob, b: Glob) -> bool:
    """Whether some instance address matches both globs.

    Keyless module steps in prefixes mean "any key", so two prefixes intersect when their module paths
    agree step by step on names and on keys wherever both give one (``module.a.module.b["x"].*`` and
    ``module.a["k"].module.b.*`` share ``module.a["k"].module.b["x"]``), even when neither covers the other.
    """
    if a.is_everything or b.is_everything:
        return True
    if a.is_output or b.is_output:
        if not (a.is_output and b.is_output):
            return False  # outputs and instances never share an address
        return _outputs_intersect(a, b)
    if a.is_exact:
        return matches(b, a.address)
    if b.is_exact:
        return matches(a, b.address)
    if a.kind is GlobKind.MODULE and b.kind is GlobKind.MODULE:
        return _steps_unify(a.module, b.module)
    if a.kind is not GlobKind.MODULE and b.kind is not GlobKind.MODULE:  # resource and type prefixes
        return (
            _type_of(a) == _type_of(b)
            and (a.resource == b.resource or GlobKind.TYPE in (a.kind, b.kind))
            and len(a.module) == len(b.module)
            and _steps_unify(a.module, b.module)
        )
    module, resource = (a, b) if a.kind is GlobKind.MODULE else (b, a)
    return len(resource.module) >= len(module.module) and _steps_unify(module.module, resource.module)


def covers(wide: Glob, narrow: Glob) -> bool:
    """Whether every address (and root output) ``narrow`` matches is matched by ``wide`` too.

    This is the reservation matrix's notion of containment: ``wide`` covers ``narrow`` exactly when every
    glob that intersects ``narrow`` also intersects ``wide`` (the tests check it against ``intersects`` by
    brute force). A keyless module step of a prefix means "any key", so it covers a keyed step, never the
    other way round; an exact glob covers only itself.
    """
    if wide.is_everything:
        return True
    if narrow.is_everything:
        return False
    if wide.is_output or narrow.is_output:
        if not (wide.is_output and narrow.is_output):
            return False
        return _outputs_cover(wide, narrow)
    if narrow.is_exact:
        return matches(wide, narrow.address)
    if wide.is_exact:
        return False
    if wide.kind is GlobKind.MODULE:
        return len(narrow.module) >= len(wide.module) and _steps_cover(wide.module, narrow.module)
    if narrow.kind is GlobKind.MODULE or _type_of(wide) != _type_of(narrow):
        return False
    if wide.kind is GlobKind.RESOURCE and narrow.resource != wide.resource:
        return False  # a resource prefix covers its own instances, never a whole type
    return len(narrow.module) == len(wide.module) and _steps_cover(wide.module, narrow.module)


def conflicts(mode_a: str, glob_a: Glob, mode_b: str, glob_b: Glob) -> bool:
    """The conflict matrix: read/read never conflicts; any intersection involving a write does.

    Raises ValueError for a mode other than ``"read"`` or ``"write"`` (checked even when the globs are
    disjoint, so a bad mode never slips through unnoticed).
    """
    for mode in (mode_a, mode_b):
        if mode not in _MODES:
            raise ValueError(f"unknown reservation mode {mode!r}: use 'read' or 'write'")
    if mode_a == READ and mode_b == READ:
        return False
    return intersects(glob_a, glob_b)


def _outputs_intersect(a: Glob, b: Glob) -> bool:
    """Two output globs share a name: ``output.*`` meets every one; a prefix meets the names it starts
    and the prefixes it starts or that start it."""
    if GlobKind.OUTPUTS in (a.kind, b.kind):
        return True
    x, y = str(a.output), str(b.output)
    if a.kind is GlobKind.OUTPUT and b.kind is GlobKind.OUTPUT:
        return x == y
    if a.kind is GlobKind.OUTPUT:
        return x.startswith(y)
    if b.kind is GlobKind.OUTPUT:
        return y.startswith(x)
    return x.startswith(y) or y.startswith(x)


def _outputs_cover(wide: Glob, narrow: Glob) -> bool:
    """Every name of ``narrow`` is one of ``wide``: one name covers only itself, a prefix covers the names
    and longer prefixes it starts."""
    if wide.kind is GlobKind.OUTPUTS:
        return True
    if narrow.kind is GlobKind.OUTPUTS:
        return False
    if wide.kind is GlobKind.OUTPUT:
        return narrow.kind is GlobKind.OUTPUT and wide.output == narrow.output
    return str(narrow.output).startswith(str(wide.output))


def stored_glob(text: str) -> Glob:
    """A glob read back from a reservation, a hold or a saved footprint. Such globs were canonical when they
    were written; one that no longer parses (a grammar change, a damaged row) counts as ``*``, so every
    conflict rule fails closed on it: a warning or a wait is never lost to a format change."""
    try:
        return parse_glob(text)
    except GlobError:
        return Glob.everything()


def texts_conflict(mode_a: str, text_a: str, mode_b: str, text_b: str) -> bool:
    """:func:`conflicts` over glob texts that were stored (see :func:`stored_glob`): the one rule by which
    footprints, reservations and holds meet each other."""
    return conflicts(mode_a, stored_glob(text_a), mode_b, stored_glob(text_b))


def _type_of(glob: Glob) -> tuple[str, str] | None:
    """``(mode, type)`` of a resource, exact or type glob."""
    if glob.resource is not None:
        return glob.resource[0], glob.resource[1]
    return glob.resource_type


def _steps_cover(pattern: tuple[ModuleStep, ...], module: tuple[ModuleStep, ...]) -> bool:
    """Whether each pattern step covers the module step at its position (extra module steps are ignored)."""
    return all(
        p.name == m.name and (p.key is None or p.key == m.key) for p, m in zip(pattern, module, strict=False)
    )


def _steps_unify(a: tuple[ModuleStep, ...], b: tuple[ModuleStep, ...]) -> bool:
    """Whether some module path is covered by both step sequences over their common length."""
    return all(
        x.name == y.name and (x.key is None or y.key is None or x.key == y.key)
        for x, y in zip(a, b, strict=False)
    )


















