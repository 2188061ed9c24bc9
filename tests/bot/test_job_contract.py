"""The bot's job contract without services: every kind has a job function, typed arguments that survive
the round trip through RQ's keyword arguments and ``bot_jobs.args``, and comment commands parse once."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from app.domain import commands
from app.domain.commands import CommandName
from app.domain.jobs import ARGS, REGISTRY, JobKind, args_from_json
from app.queue import JOBS

REPO = Path(__file__).resolve().parents[2]


def _example(kind: JobKind):  # type: ignore[no-untyped-def]
    cls = ARGS[kind]
    return cls(**{f.name: 7 if f.type in ("int", int) else f"{f.name}-x" for f in fields(cls)})


@pytest.mark.parametrize("kind", list(JobKind))
def test_every_kind_has_a_job_function_taking_its_arguments_by_keyword(kind):
    module, _, name = JOBS[kind].rpartition(".")
    function = getattr(importlib.import_module(module), name)
    args = _example(kind)
    assert list(args.to_kwargs()) == [p for p in function.__code__.co_varnames[:function.__code__.co_argcount]]
    assert args_from_json(kind, args.to_kwargs()) == args


@pytest.mark.parametrize("kind", list(JobKind))
def test_every_registry_row_names_an_importable_function_whose_signature_is_its_argument_type(kind):
    spec = REGISTRY[kind]
    assert spec.kind is kind and spec.args.kind is kind and ARGS[kind] is spec.args and JOBS[kind] == spec.entry
    module, _, name = spec.entry.rpartition(".")
    function = getattr(importlib.import_module(module), name)
    parameters = inspect.signature(function).parameters.values()
    assert [(p.name, p.kind, p.annotation) for p in parameters] == [
        (f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, f.type) for f in fields(spec.args)]
    assert inspect.signature(function).return_annotation == "str"


def _sources() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(REPO).as_posix(), ast.parse(path.read_text(), str(path)))
            for top in ("app", "runner") for path in sorted((REPO / top).rglob("*.py"))]


def test_no_other_module_registers_kinds():
    """Job functions are named only by the registry; the only other tables keyed by kind are the bot's
    per-kind behaviour for the kinds whose outcome is stored (how to run and post it, its result type)."""
    entry = re.compile(r"runner\.bot\.jobs\.\w+")
    named = {path for path, tree in _sources() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and entry.fullmatch(node.value)}
    assert named == {"app/domain/jobs.py"}
    keyed = {path for path, tree in _sources() for node in ast.walk(tree)
             if isinstance(node, ast.Dict) and node.keys and all(
                 isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name) and k.value.id == "JobKind"
                 for k in node.keys)}
    assert keyed == {"runner/bot/jobs.py", "runner/bot/results.py"}


def test_a_row_that_kept_no_arguments_reads_as_none():
    assert args_from_json(JobKind.COMMENT, {}) is None


def test_stored_kinds_have_a_runner_and_a_deliverer_and_a_result_type():
    from runner.bot.jobs import HANDLERS
    from runner.bot.results import RESULTS

    assert set(HANDLERS) <= set(RESULTS)
    assert set(JobKind) - set(HANDLERS) == {JobKind.RERUN, JobKind.RECONCILE_HOLDS, JobKind.DRIFT_TICK,
                                            JobKind.DRIFT_CHECK, JobKind.EVENTS_TICK}


@pytest.mark.parametrize("body, word, name, project, problem", [
    ("kilolock plan", "plan", CommandName.PLAN, None, False),
    ("KiloLock   Apply -p prod", "apply", CommandName.APPLY, "prod", False),
    ("kilolock apply now please", "apply", CommandName.APPLY, None, True),
    ("kilolock", "help", CommandName.HELP, None, False),
    ("kilolock unlock", "unlock", CommandName.UNLOCK, None, False),
    ("kilolock destroy", "destroy", None, None, False),
])
def test_comment_commands_are_parsed_once_into_a_typed_command(body, word, name, project, problem):
    command = commands.parse(body)
    assert command is not None and (command.word, command.name) == (word, name)
    assert command.apply.project == project and bool(command.apply.problem) == problem


@pytest.mark.parametrize("body, globs, reason, project, until, problem", [
    ('kilolock hold module.db.* terraform_data.x --reason "change freeze" --until 2h',
     ("module.db.*", "terraform_data.x"), "change freeze", None, 7200.0, False),
    ("kilolock hold terraform_data.x -p prod --reason vendor window\nplease", ("terraform_data.x",),
     "vendor window please", "prod", None, False),
    ("kilolock hold --reason no globs", (), "", None, None, True),
    ("kilolock hold terraform_data.x", (), "", None, None, True),
    ("kilolock hold terraform_data.x --until", (), "", None, None, True),
    ("kilolock hold terraform_data.x --until soon --reason r", (), "", None, None, True),
    ("kilolock hold terraform_data.x --force --reason r", (), "", None, None, True),
])
def test_hold_comments_parse_globs_reason_and_options(body, globs, reason, project, until, problem):
    command = commands.parse(body)
    assert command is not None and command.name is CommandName.HOLD
    args = command.hold
    assert (args.globs, args.reason, args.project, args.until_seconds, bool(args.problem)) == (
        globs, reason, project, until, problem)


def test_release_comments_take_one_bounded_hold_id():
    assert commands.parse("kilolock release ar_0123").hold.hold_id == "ar_0123"  # type: ignore[union-attr]
    for body in ("kilolock release", "kilolock release a b", "kilolock release " + "x" * 41):
        found = commands.parse(body)
        assert found is not None and found.name is CommandName.RELEASE and found.hold.problem, body


def test_comments_not_addressed_to_kilolock_are_no_command():
    assert commands.parse("LGTM, kilolock plan later") is None and commands.parse("") is None
