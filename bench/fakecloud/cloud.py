"""A tiny "cloud" that keeps its objects as JSON files in a directory, one per object:
``ROOT/REGION/KIND/NAME.json``. The fakecloud provider reads and writes it; tests edit or delete the
files to change real objects behind Terraform's back.

Nothing here imports Terraform or the provider framework, so tests use it directly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("bucket", "queue")


class CloudError(Exception):
    """An object is missing, already exists, or is referenced but absent."""


@dataclass(frozen=True, slots=True)
class Cloud:
    root: Path

    def _path(self, region: str, kind: str, name: str) -> Path:
        if kind not in KINDS:
            raise CloudError(f"unknown kind {kind!r}")
        if not name or "/" in name or name.startswith("."):
            raise CloudError(f"invalid object name {name!r}")
        return self.root / region / kind / f"{name}.json"

    def get(self, region: str, kind: str, name: str) -> dict[str, Any] | None:
        path = self._path(region, kind, name)
        try:
            loaded: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        return loaded

    def put(self, region: str, kind: str, name: str, obj: dict[str, Any]) -> None:
        path = self._path(region, kind, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(obj, sort_keys=True))
        tmp.replace(path)  # readers in other provider processes never see half an object

    def delete(self, region: str, kind: str, name: str) -> bool:
        try:
            self._path(region, kind, name).unlink()
            return True
        except FileNotFoundError:
            return False

    def edit(self, region: str, kind: str, name: str, **changes: Any) -> dict[str, Any]:
        """Change an object behind Terraform's back (tests)."""
        obj = self.get(region, kind, name)
        if obj is None:
            raise CloudError(f"no {kind} {name!r} in {region}")
        obj.update(changes)
        self.put(region, kind, name, obj)
        return obj

    def names(self, region: str, kind: str) -> list[str]:
        folder = self.root / region / kind
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
