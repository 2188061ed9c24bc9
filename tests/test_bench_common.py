"""The benches' shared parts: they never import the test suite, their section writer replaces exactly one section,
and a timing shim whose target moved stops the bench naming it."""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest

from bench.common import (
    BenchError,
    ShimError,
    background_pending,
    bench_parser,
    command_line,
    out_path,
    shim_target,
    wait_until_idle,
    write_section,
)

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


def test_a_time_boxed_process_is_killed_with_its_children(tmp_path: Path) -> None:
    from bench.filescoped_bench import TimedOut, run

    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    with pytest.raises(TimedOut, match=r"slow: did not finish within 1 s"):
        run(["sh", "-c", script], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, label="slow", timeout=1.0)
    child = Path(f"/proc/{int(pid_file.read_text())}/stat")
    assert not child.exists() or child.read_text().split(") ")[1].startswith(("Z", "X"))
    assert run(["sh", "-c", "echo done"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=30).output == "done\n"
    with pytest.raises(BenchError, match=r"exited 3 in .*\n.*went wrong"):
        run(["sh", "-c", "echo went wrong; exit 3"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})


def test_the_scale_report_judges_each_row_against_its_target() -> None:
    from bench.scale_bench import SizeResult, render

    def sized(n: int, *, first_get: float, apply: float) -> SizeResult:
        return SizeResult(instances=n, body_bytes=100_000_000, floor=2.0, first_post=4.0, change_post=6.0,
                          raw_get=1.0, commits=[0.01] * 12, first_get=first_get, cached_get=1.1,
                          rss_idle=60_000_000, rss_post=200_000_000, rss_before_get=60_000_000,
                          rss_first_get=190_000_000, load="1, 1, 1",
                          wide_bytes=130_000_000, wide_floor=2.0, wide_first_post=4.5, wide_change_post=5.0,
                          plan_cold=[5.0, 6.0, 5.5], plan_warm=[3.0, 2.5, 2.8], apply=[apply] * 3,
                          vanilla=None, vanilla_note="did not finish within 20 min", slice_load="1, 1, 1")

    text = render("cmd", [("Cores", "2")], [sized(50_000, first_get=1.5, apply=2.0),
                                             sized(200_000, first_get=14.5, apply=2.6)])
    assert "vanilla `terraform plan -refresh=false`: did not finish within 20 min" in text
    assert re.search(r"warm parse cache\s*\|\s*2\.80 s \(2\.50 s-3\.00 s\)\s*\|", text)
    assert "- 50,000 instances: missed: whole-state POST, one instance changed (100 MB)." in text
    assert ("- 200,000 instances: missed: whole-state POST, one instance changed (100 MB); first GET after 12 "
            "commits (assembled from rows).") in text
    assert "2.60 s / 2.00 s = 1.30x (target <= 1.25x: MISSED)" in text
    assert re.search(r"first GET, growth over the worker just before it\s*\|\s*190 MB \(\+130 MB\).*\|\s*1\.30x growth"
                     r"\s*\|\s*<= 1\.5x: met", text)


def test_the_scale_report_gives_the_samples_of_the_first_get_and_its_floor() -> None:
    from bench.scale_bench import SizeResult, size_rows

    rows = size_rows(SizeResult(instances=1000, body_bytes=1_000_000, floor=1.0, first_post=1.0, change_post=1.0,
                                raw_get=0.5, raw_gets=[0.4, 0.5, 0.7], first_get=0.9, first_gets=[1.2, 0.9, 0.8],
                                commits=[0.01], cached_get=0.5, wide_bytes=1, wide_floor=1.0, wide_first_post=1.0,
                                wide_change_post=1.0, rss_first_get=2, rss_before_get=1, rss_idle=1))
    first = next(row for row in rows if row[0].startswith("**first GET"))
    assert first[1:4] == ["900 ms (median of 1.20 s, 900 ms, 800 ms)",
                          "raw GET of the stored bytes: 500 ms (median of 400 ms, 500 ms, 700 ms)", "1.80x"]


def test_the_background_gauge_is_read_by_queue_and_its_absence_stops_the_bench() -> None:
    text = ('# HELP kilolock_background_pending Work ...\n# TYPE kilolock_background_pending gauge\n'
            'kilolock_background_pending{queue="upkeep"} 2.0\nkilolock_background_pending{queue="splice_bases"} 0.0\n'
            'kilolock_states 3.0\n')
    assert background_pending(text) == {"upkeep": 2.0, "splice_bases": 0.0}
    with pytest.raises(BenchError, match="no kilolock_background_pending"):
        background_pending("kilolock_states 3.0\n")


def test_waiting_for_an_idle_server_reads_its_metrics(client) -> None:  # type: ignore[no-untyped-def]
    """The wait polls /metrics; against the app's own metrics view (through a shim of ``session.get``)."""
    class _Session:
        def get(self, url: str, timeout: float) -> object:
            answer = client.get(url.removeprefix("http://app"))
            return types.SimpleNamespace(status_code=answer.status_code, text=answer.get_data(as_text=True))

    assert wait_until_idle("http://app", _Session(), timeout=5) >= 0
