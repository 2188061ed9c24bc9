"""The serial rule for whole-state writes."""

from __future__ import annotations

from app.errors import SerialConflictError


def check_new_serial(state_name: str, head_serial: int | None, new_serial: int) -> None:
    """A new version must have a serial above the head's (byte-identical replays are handled
    before this rule). Equal means another writer got there first; lower means a stale writer."""
    if head_serial is None or new_serial > head_serial:
        return
    if new_serial == head_serial:
        raise SerialConflictError(
            f"state {state_name!r} already has serial {head_serial} with different content: "
            "refresh (terraform state pull) and retry with a higher serial",
            head_serial=head_serial,
            serial=new_serial,
        )
    raise SerialConflictError(
        f"stale state for {state_name!r}: the write has serial {new_serial} but the head is serial "
        f"{head_serial}; pull the current state and re-run instead of pushing an old one",
        head_serial=head_serial,
        serial=new_serial,
    )
