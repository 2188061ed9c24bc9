"""What an apply run was for, read from the ``info`` its client recorded when it opened the run.

An apply run is also how ``kl apply --dry-run`` rehearses, how ``kl drift`` and ``kl refresh`` hold their
slice, and how ``kl recover`` commits a kept state; those end with the statuses of any run (a dry run and a
drift check end as ``aborted``, having committed nothing by design), so listings show the kind beside the
status. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class RunKind(StrEnum):
    APPLY = "apply"
    DRY_RUN = "dry-run"
    DRIFT = "drift"
    REFRESH = "refresh"
    RECOVER = "recover"


def run_kind(info: Mapping[str, Any] | None) -> RunKind:
    """The kind of a run from its ``info``: the ``kind`` kl drift and kl refresh set, ``dry_run`` of
    kl apply --dry-run, ``recovers`` of kl recover; anything else (the bot's applies included) is an apply."""
    info = info or {}
    kind = info.get("kind")
    if kind in (RunKind.DRIFT, RunKind.REFRESH):
        return RunKind(kind)
    if info.get("dry_run") is True:
        return RunKind.DRY_RUN
    if info.get("recovers"):
        return RunKind.RECOVER
    return RunKind.APPLY
