"""Who is asking: the authenticated principal every store call is scoped by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.domain.scopes import ScopeSet

DEFAULT_TENANT_ID = 1
# The credential of the open and static modes: one per deployment, shared by every caller.
SHARED_CREDENTIAL = "shared"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``scope`` namespaces state names inside a tenant
    (empty for the open and static modes).

    ``credential`` identifies the credential the request presented, for binding apply runs to it:
    ``token:ID`` in database mode. The open and static modes have one shared credential (none, or
    the one static token), so every caller there has the same ``credential`` and a run is bound
    only to that deployment-wide credential; the run's holder name is then the only guard between
    callers, and it is a display name, not a secret.

    ``scopes`` are the token's address scopes (``app.domain.scopes``), None for a token without any: the
    whole state, as in the open and static modes."""

    tenant_id: int
    actor: str
    scope: str = ""
    token_name: str = ""
    credential: str = SHARED_CREDENTIAL
    scopes: ScopeSet | None = None

    @classmethod
    def for_token(cls, *, tenant_id: int, name: str, scope: str, token_id: int,
                  scopes: ScopeSet | None = None) -> Principal:
        """The principal of a database-mode token: actor and token name are its name."""
        return cls(tenant_id=tenant_id, actor=name, scope=scope, token_name=name, credential=f"token:{token_id}",
                   scopes=scopes)


def default_principal(actor: str = "anonymous") -> Principal:
    """The built-in single tenant used by the ``open`` and ``static`` auth modes."""
    return Principal(tenant_id=DEFAULT_TENANT_ID, actor=actor)
