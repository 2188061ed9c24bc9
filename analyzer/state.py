"""Terraform state files (format version 4) to instance rows: the entry point the server and the runner call.

:func:`parse_state` reads a body instance by instance when it has Terraform's own shape
(``analyzer.statestream``: no whole parsed tree) and as one document otherwise (``analyzer.staterows``,
which also owns the row shapes, the canonical JSON text and the content hash); both give the same rows.
The reverse, rows into a state file Terraform reads as its own, is ``analyzer.state_assembly``.

Must not do I/O. Imports both parsers and is imported by neither.
"""

from __future__ import annotations

from analyzer.gcpause import gc_paused
from analyzer.staterows import _EMPTY_METADATA as _EMPTY_METADATA
from analyzer.staterows import (
    STATE_VERSION,
    EncryptedState,
    InstanceObjectAddress,
    InstanceRow,
    OutputRow,
    ParsedState,
    StateFormatError,
    canonical_json,
    normalize_instance,
)
from analyzer.staterows import _canonical as _canonical
from analyzer.staterows import _canonical_accelerated as _canonical_accelerated
from analyzer.staterows import _FloatCheck as _FloatCheck
from analyzer.staterows import _parse_state as _parse_state
from analyzer.staterows import orjson as orjson  # optional: None when absent (the tests also set it so)
from analyzer.statestream import Unstreamable, Watch, stream_state

__all__ = [
    "STATE_VERSION",
    "EncryptedState",
    "InstanceObjectAddress",
    "InstanceRow",
    "OutputRow",
    "ParsedState",
    "StateFormatError",
    "canonical_json",
    "normalize_instance",
    "parse_state",
    "parse_state_watched",
]


def parse_state(raw: bytes) -> ParsedState | EncryptedState:
    """Split a state body into rows, or recognise OpenTofu's encrypted envelope.

    Raises StateFormatError when the body is not JSON, not a v4 state, or structurally broken.
    Unknown fields are ignored here but kept inside each row's ``instance_json``. The cyclic garbage
    collector is paused while it runs (see ``analyzer.gcpause``).
    """
    with gc_paused():
        return _parse_any(raw, accelerated=orjson is not None)


def parse_state_watched(raw: bytes | bytearray, watch: Watch) -> ParsedState | None:
    """``parse_state`` of a body in Terraform's own shape, handing its rows to ``watch`` as they are read
    (``analyzer.statestream``), so a caller can store them while the rest is parsed; None for any other body
    (and for a body that is not a usable state): ``parse_state`` then gives the exact answer or error. Rows
    handed on before a None are not to be used. The cyclic garbage collector is paused while it runs.
    """
    with gc_paused():
        try:
            return stream_state(raw, accelerated=orjson is not None, watch=watch)
        except Unstreamable:
            return None


def _parse_any(raw: bytes, *, accelerated: bool) -> ParsedState | EncryptedState:
    """Instance by instance when the body has Terraform's shape, else the whole document at once."""
    try:
        return stream_state(raw, accelerated=accelerated)
    except Unstreamable:
        return _parse_state(raw, accelerated=accelerated)
