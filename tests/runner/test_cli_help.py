"""kl explains itself: every command's --help starts with what it does, every option and argument has a
help line, and every option with a default says it."""

from __future__ import annotations

import argparse

from runner.cli import build_parser


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found.extend(parsers(sub))
    return found


def test_every_command_has_a_description_and_every_argument_a_help_line_with_its_default():
    problems = []
    for parser in parsers(build_parser()):
        if not parser.description:
            problems.append(f"{parser.prog}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            name = "/".join(action.option_strings) or action.metavar or action.dest
            if not action.help:
                problems.append(f"{parser.prog} {name}: no help")
            elif (action.help is not argparse.SUPPRESS and action.default not in (None, False, [])
                  and "default" not in action.help):
                problems.append(f"{parser.prog} {name}: the help does not say its default {action.default!r}")
    assert not problems, "\n".join(problems)


def test_a_subcommand_help_begins_with_the_line_kl_help_lists(capsys):
    parser = build_parser()
    try:
        parser.parse_args(["migrate", "--help"])
    except SystemExit as done:
        assert done.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2] == "Apply pending database migrations."
