"""Golden files for the bot's comment bodies (tests/fixtures/comments/), changed only with
``pytest --update-golden`` and reviewed as diffs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "comments"


def normalize(text: str, names: dict[str, str] | None = None) -> str:
    """Commit ids and run ids vary from run to run: ``names`` maps known ones to stable names, and any
    other id becomes ``<sha>`` or ``<run>``."""
    for value, name in sorted((names or {}).items(), key=lambda item: -len(item[0])):
        text = text.replace(value, name).replace(value[:12], name).replace(value[:7], name)
    text = re.sub(r"\bar_[0-9a-f]{8,}\b", "<run>", text)
    return re.sub(r"(?<![0-9a-z])[0-9a-f]{7,40}(?![0-9a-z])", "<sha>", text)


def assert_golden(request: Any, name: str, actual: str) -> None:
    path = GOLDEN / name
    if request.config.getoption("--update-golden"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"no golden file {path.name}: run pytest --update-golden and review it"
    assert actual == path.read_text(encoding="utf-8"), f"{path.name} differs: review, then pytest --update-golden"
