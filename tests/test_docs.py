"""The docs are part of the feature: every setting and every kl command is documented."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.config import setting_names
from runner.cli import build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_setting_is_documented():
    text = (DOCS / "configuration.md").read_text()
    missing = [name for name in setting_names() if f"`{name}`" not in text]
    assert not missing, f"document these in docs/configuration.md: {missing}"


def _commands(parser: argparse.ArgumentParser, prefix: str = "kl") -> list[str]:
    found: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(f"{prefix} {name}")
                found.extend(_commands(sub, f"{prefix} {name}"))
    return found


def test_every_kl_command_is_documented():
    text = (DOCS / "cli.md").read_text()
    commands = _commands(build_parser())
    assert "kl state ls" in commands
    leaves = [c for c in commands if not any(o.startswith(c + " ") for o in commands)]
    missing = [c for c in leaves if f"`{c}" not in text]
    assert not missing, f"document these in docs/cli.md: {missing}"


def test_the_readme_links_only_to_existing_docs():
    readme = (DOCS.parent / "README.md").read_text()
    for line in readme.splitlines():
        if "](docs/" in line:
            target = line.split("](", 1)[1].split(")", 1)[0]
            assert (DOCS.parent / target).exists(), target
