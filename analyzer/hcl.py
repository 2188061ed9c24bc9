"""The only importer of python-hcl2: reads what Kilolock needs out of .tf files.

Pure: callers hand in file texts; nothing here touches the filesystem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import hcl2


class HclError(ValueError):
    """A .tf file could not be parsed; the message names the file."""


@dataclass(frozen=True, slots=True)
class HttpBackend:
    """The literal settings of a ``backend "http"`` block (None where not set)."""

    file: str
    address: str | None
    lock_address: str | None
    unlock_address: str | None
    username: str | None
    password: str | None


def _literal(value: Any) -> str | None:
    """python-hcl2 8.x keeps string literals quoted (``'"x"'``); backend settings must be literals."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            decoded = json.loads(value)
        except ValueError:
            return value[1:-1]
        return decoded if isinstance(decoded, str) else None
    return str(value)


def find_http_backend(files: Mapping[str, str]) -> HttpBackend | None:
    """The ``backend "http"`` block among the given files (path → text), or None."""
    for path in sorted(files):
        text = files[path]
        if "backend" not in text:
            continue
        try:
            doc = hcl2.loads(text)
        except Exception as exc:  # python-hcl2 raises lark errors of several kinds
            raise HclError(f"{path}: cannot parse HCL ({exc.__class__.__name__})") from exc
        for terraform in doc.get("terraform", []):
            for backend in terraform.get("backend", []):
                for label, body in backend.items():
                    if label.strip('"') != "http" or not isinstance(body, dict):
                        continue
                    return HttpBackend(
                        file=path,
                        address=_literal(body.get("address")),
                        lock_address=_literal(body.get("lock_address")),
                        unlock_address=_literal(body.get("unlock_address")),
                        username=_literal(body.get("username")),
                        password=_literal(body.get("password")),
                    )
    return None
