"""The ``backend "http"`` blocks Kilolock prints for users to paste."""

from __future__ import annotations


def backend_block(base_url: str, state: str = "example", *, static_auth: bool = False) -> str:
    """The block for the open and static modes."""
    address = f"{base_url}/v1/states/{state}"
    lines = [
        "terraform {",
        '  backend "http" {',
        f'    address        = "{address}"',
        f'    lock_address   = "{address}"',
        f'    unlock_address = "{address}"',
        '    lock_method    = "LOCK"',
        '    unlock_method  = "UNLOCK"',
    ]
    if static_auth:
        lines.append("    # password: export TF_HTTP_PASSWORD=<KL_AUTH_TOKEN>")
    return "\n".join(lines + ["  }", "}"])


def scoped_backend_block(base_url: str, workspace_id: str, environment_id: str, state: str = "prod") -> str:
    """The block for a database-mode token (the password comes from TF_HTTP_PASSWORD)."""
    path = f"{workspace_id}/{environment_id}/{state}"
    return "\n".join([
        "terraform {",
        '  backend "http" {',
        f'    address        = "{base_url}/v1/states/{path}"',
        f'    lock_address   = "{base_url}/v1/states/{path}"',
        f'    unlock_address = "{base_url}/v1/state-unlock/{path}"',
        '    lock_method    = "LOCK"',
        '    unlock_method  = "POST"',
        f'    username       = "{workspace_id}"',
        "    # password: export TF_HTTP_PASSWORD=<token secret>",
        "  }",
        "}",
    ])
