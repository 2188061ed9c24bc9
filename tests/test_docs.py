"""The docs are part of the feature: every setting and every kl command is documented."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.config import TABLE as SERVICE_TABLE
from app.config import setting_names
from runner.cli import build_parser
from runner.core.config import TABLE as CLIENT_TABLE

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _documented_tables() -> dict[str, dict[str, str]]:
    """Each ``##`` section of configuration.md → {variable: its default cell} of the section's table."""
    found: dict[str, dict[str, str]] = {}
    section = ""
    for line in (DOCS / "configuration.md").read_text().splitlines():
        if line.startswith("#"):
            section = line.lstrip("# ")
        elif line.startswith("| `"):
            variable, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
            found.setdefault(section, {})[variable.strip("`")] = default
    return found


def test_every_setting_is_documented():
    text = (DOCS / "configuration.md").read_text()
    missing = [name for name in setting_names() if f"`{name}`" not in text]
    assert not missing, f"document these in docs/configuration.md: {missing}"


@pytest.mark.parametrize("section, table", [("Configuration", SERVICE_TABLE),
                                            ("Client settings for `kl`", CLIENT_TABLE)])
def test_each_settings_table_and_its_documented_table_agree_both_ways(section, table):
    documented = _documented_tables()[section]
    wrong = {row.variable: (documented.get(row.variable), row.documented_default) for row in table
             if not documented.get(row.variable, "").startswith(row.documented_default)}
    assert not wrong, f"docs/configuration.md ({section}): variable → (documented default, the table's): {wrong}"
    read_by_dev = (DOCS.parent / "dev").read_text()
    unknown = [v for v in documented if v not in {row.variable for row in table} and f"${{{v}:-" not in read_by_dev]
    assert not unknown, f"docs/configuration.md ({section}) documents variables nothing reads: {unknown}"


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


def test_the_readme_lists_every_page_of_the_docs():
    readme = (DOCS.parent / "README.md").read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not missing, f"list these in the README's Documentation section: {missing}"


def test_sample_apply_summaries_in_the_docs_read_as_kl_prints_them():
    import re

    from runner.core.counts import counts_line

    printed = re.compile(r"apply complete: \w+ added, \w+ changed, \w+ destroyed\b")
    pages = [*DOCS.glob("*.md"), *(DOCS.parent / "examples").glob("*/README.md"), DOCS.parent / "README.md"]
    wrong = [f"{page.name}: {line.strip()}" for page in pages for line in page.read_text().splitlines()
             if "apply complete:" in line and not printed.search(line)]
    assert not wrong, wrong
    assert counts_line({"a": "replace", "b": "replace"}) == "2 added, 0 changed, 2 destroyed (2 replaced)"
