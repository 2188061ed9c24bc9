"""The package layering of STYLE.md, checked by importing each entry point in a fresh process, and the
import graph of the packages, read from their source, free of cycles."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def loaded_modules(statement: str) -> set[str]:
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _has(modules: set[str], root: str) -> bool:
    return any(m == root or m.startswith(root + ".") for m in modules)


@pytest.mark.parametrize("statement, forbidden", [
    ("import analyzer.state, analyzer.addresses, analyzer.hcl", ["app", "runner", "flask", "psycopg"]),
    ("import app", ["flask", "runner", "psycopg"]),
    ("import app.domain.lifecycle, app.domain.locking", ["flask", "runner", "psycopg"]),
    ("import app.store.states, app.store.graph", ["flask", "runner"]),
    ("import app.web", ["runner", "subprocess_terraform"]),
    # The CLI imports no job module: kl worker loads the bot (and RQ) inside the command.
    ("import runner.cli", ["app.web", "flask", "runner.bot", "runner.jobs", "rq", "pydantic"]),
    # pydantic is loaded on the first document read or written, not by importing the layer.
    ("import app.wire, runner.core.spec, runner.core.engine_client", ["pydantic"]),
])
def test_entry_points_do_not_load_forbidden_layers(statement, forbidden):
    modules = loaded_modules(statement)
    leaked = [f for f in forbidden if _has(modules, f)]
    assert not leaked, f"{statement!r} loaded {leaked}"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_app_web_never_imports_runner_or_subprocess():
    for path in (REPO / "app").rglob("*.py"):
        imports = _imports(path)
        assert not any(i == "runner" or i.startswith("runner.") for i in imports), path
        if path.is_relative_to(REPO / "app" / "web"):
            assert "subprocess" not in imports, path


def test_the_cli_is_imported_by_nothing_but_itself():
    # runner.cli is an entry point: the core and the bot share runner.core.errors, never the command line.
    for path in list((REPO / "app").rglob("*.py")) + list((REPO / "runner").rglob("*.py")):
        if path.is_relative_to(REPO / "runner" / "cli"):
            continue
        assert not any(i == "runner.cli" or i.startswith("runner.cli.") for i in _imports(path)), path


def test_the_core_never_imports_the_cli_or_the_bot():
    # runner.core is what the CLI (runner.cli) and the bot (runner.bot) both run: it knows neither of them.
    for path in (REPO / "runner" / "core").rglob("*.py"):
        imports = _imports(path)
        assert not any(i.startswith(("runner.cli", "runner.bot")) for i in imports), path
        assert not any(i == "runner" for i in imports), path  # from runner import cli / bot
    modules = loaded_modules("import " + ", ".join(
        f"runner.core.{p.stem}" for p in sorted((REPO / "runner" / "core").glob("*.py")) if p.stem != "__init__"))
    assert not _has(modules, "runner.cli") and not _has(modules, "runner.bot"), sorted(
        m for m in modules if m.startswith(("runner.cli", "runner.bot")))


def test_sql_lives_only_in_app_store():
    for path in list((REPO / "app").rglob("*.py")) + list((REPO / "runner").rglob("*.py")):
        if path.is_relative_to(REPO / "app" / "store"):
            continue
        assert not any(i == "psycopg" or i.startswith("psycopg.") for i in _imports(path)), path


def test_only_the_config_modules_read_the_environment():
    allowed = {REPO / "app" / "config.py", REPO / "runner" / "core" / "config.py"}
    for path in list((REPO / "app").rglob("*.py")) + list((REPO / "runner").rglob("*.py")) + list(
            (REPO / "analyzer").rglob("*.py")):
        if path in allowed:
            continue
        tree = ast.parse(path.read_text())
        reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                 and n.value.id == "os" and n.attr in ("environ", "getenv", "putenv")]
        assert not reads, f"{path}:{reads[0].lineno} reads the environment"


def test_hcl2_is_imported_only_by_analyzer_hcl():
    for path in REPO.glob("*/**/*.py"):
        if ".venv" in path.parts or path == REPO / "analyzer" / "hcl.py":
            continue
        assert not any(i == "hcl2" for i in _imports(path)), path


def test_the_bot_package_is_the_only_importer_of_the_github_client():
    bot = REPO / "runner" / "bot"
    for path in [p for top in ("app", "analyzer", "runner") for p in (REPO / top).rglob("*.py")]:
        imports = _imports(path)
        if path.is_relative_to(bot):
            continue
        assert "runner.bot.github" not in imports, path
        assert not any(i == "github" or i.startswith("github.") for i in imports), path  # PyGithub
    assert "github" in _imports(bot / "github.py")


def test_pygithub_is_imported_by_the_github_client_alone_so_its_retry_policy_is_the_only_one():
    # Every GitHub call goes through runner.bot.github's one retry policy (PyGithub's own retry is off):
    # a second module holding PyGithub could call GitHub around it, or retry again on top of it.
    client = REPO / "runner" / "bot" / "github.py"
    for path in [p for top in ("app", "analyzer", "runner", "bench") for p in (REPO / top).rglob("*.py")]:
        if path != client:
            assert not any(i == "github" or i.startswith("github.") for i in _imports(path)), path


def test_app_never_imports_the_bot_even_where_it_enqueues_its_jobs():
    for path in (REPO / "app").rglob("*.py"):
        assert not any(i == "runner.bot" or i.startswith("runner.bot.") for i in _imports(path)), path
    modules = loaded_modules("import app.queue, app.domain.webhooks, app.domain.commands, app.web.webhook")
    assert not _has(modules, "runner") and not _has(modules, "github"), sorted(m for m in modules if "runner" in m)


def _module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _import_edges(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ``known`` that ``path`` imports anywhere: at the top, inside functions or under
    ``TYPE_CHECKING`` alike (an import moved into a function still makes a cycle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    edges: set[str] = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def import_cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """The import cycles among the modules of ``packages`` under ``root``: each strongly connected group of
    two or more modules (Tarjan's algorithm, iterative), sorted."""
    files = _module_files(root, packages)
    graph = {name: sorted(_import_edges(name, path, set(files))) for name, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return sorted(cycles)


def test_no_import_cycles_among_the_packages_even_behind_function_level_imports():
    assert import_cycles(REPO, ("analyzer", "app", "runner")) == []


def test_the_cycle_finder_sees_a_cycle_closed_by_an_import_inside_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def later():\n    from pkg.a import name\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    assert import_cycles(tmp_path, ("pkg",)) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    (pkg / "sub" / "c.py").write_text("")
    assert import_cycles(tmp_path, ("pkg",)) == []


# The client core's stages, lowest first: each imports only stages before it in this list.
CORE_STAGES = ("workspace", "trunk", "session", "scope", "pins", "workbuild", "plan", "run", "recovery", "apply",
               "filescoped", "drift", "pipeline")


def test_each_core_stage_imports_only_the_stages_below_it():
    files = _module_files(REPO, ("analyzer", "app", "runner"))
    for position, stage in enumerate(CORE_STAGES):
        name = f"runner.core.{stage}"
        above = {f"runner.core.{s}" for s in CORE_STAGES[position:]}
        reached = _import_edges(name, files[name], set(files)) & above
        assert not reached, f"{name} imports the stage(s) above it: {sorted(reached)}"


def test_the_cli_and_the_bot_reach_the_change_paths_only_through_the_pipeline():
    inner = {f"runner.core.{s}" for s in ("trunk", "workbuild", "plan", "apply", "filescoped", "drift")}
    files = _module_files(REPO, ("analyzer", "app", "runner"))
    for name, path in files.items():
        if name.startswith(("runner.cli", "runner.bot")):
            reached = _import_edges(name, path, set(files)) & inner
            assert not reached, f"{name} reaches past runner.core.pipeline into {sorted(reached)}"
