"""Who is asking: the authenticated principal every store call is scoped by."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TENANT_ID = 1


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``scope`` namespaces state names inside a tenant
    (empty for the open and static modes)."""

    tenant_id: int
    actor: str
    scope: str = ""
    token_name: str = ""


def default_principal(actor: str = "anonymous") -> Principal:
    """The built-in single tenant used by the ``open`` and ``static`` auth modes."""
    return Principal(tenant_id=DEFAULT_TENANT_ID, actor=actor)
