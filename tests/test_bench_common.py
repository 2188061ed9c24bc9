"""The benches' shared parts: they never import the test suite, their section writer replaces exactly one section,
and a timing shim whose target moved stops the bench naming it."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from bench.common import ShimError, bench_parser, command_line, out_path, shim_target, write_section

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_no_bench_module_imports_the_test_suite() -> None:
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(BENCH)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "tests"]
    assert found == []


DOC = "# Benchmarks\n\nIntro.\n\n## Backend lane\n\nold backend\n\n## Backend lane, more\n\nkept\n\n## Bot\n\nold bot\n"


def test_write_section_replaces_only_the_section_of_that_title(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC)
    write_section(doc, "## Backend lane", "## Backend lane\n\nnew backend\n")
    assert doc.read_text() == DOC.replace("old backend", "new backend")
    write_section(doc, "## Bot", "## Bot\n\nnew bot\n\n\n")
    assert doc.read_text().endswith("## Backend lane, more\n\nkept\n\n## Bot\n\nnew bot\n")


def test_write_section_appends_a_new_section_and_starts_a_missing_document(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "benchmarks.md"
    write_section(doc, "## Drift checks", "## Drift checks\n\nnumbers\n")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n") and text.endswith("\n\n## Drift checks\n\nnumbers\n")
    write_section(doc, "## Webhook", "## Webhook\n\nmore\n")
    assert doc.read_text() == text + "\n## Webhook\n\nmore\n"


def test_a_timing_shim_whose_target_moved_fails_naming_it() -> None:
    owner = types.SimpleNamespace(__name__="runner.cli", cmd_plan=lambda: None, version="1")
    assert shim_target(owner, "cmd_plan") is owner.cmd_plan
    with pytest.raises(ShimError, match=r"runner\.cli\.cmd_apply is gone \(moved or renamed\?\)"):
        shim_target(owner, "cmd_apply")
    with pytest.raises(ShimError, match=r"runner\.cli\.version is gone"):
        shim_target(owner, "version")  # not a function: nothing to time
    with pytest.raises(ShimError, match=r"pathlib\.Path\.no_such_method is gone"):
        shim_target(Path, "no_such_method")


def test_the_shared_options_and_where_a_run_writes() -> None:
    p = bench_parser("x_bench", "X.\n\nMore.", section="## X", quick_help="small")
    full = p.parse_args([])
    assert (full.quick, full.out, full.json) == (False, None, None)
    assert out_path(full) == Path("docs/benchmarks.md")
    assert out_path(p.parse_args(["--quick"])) is None
    assert out_path(p.parse_args(["--quick", "--out", "o.md"])) == Path("o.md")
    bare = bench_parser("y_bench", "Y.", section="## Y", json_help=None).parse_args(["--database-url", "pg://h"])
    assert bare.database_url == "pg://h" and not hasattr(bare, "json") and out_path(bare) == Path("docs/benchmarks.md")


def test_the_recorded_command_repeats_the_run() -> None:
    command = command_line("x_bench", ["--quick", "--out", "a b.md"])
    assert command == ".venv/bin/python -m bench.x_bench --quick --out 'a b.md'"
