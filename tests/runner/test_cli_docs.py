"""docs/cli.md is checked against the argparse parser, so the two cannot drift: every command and
every option the parser has is documented under that command's heading, and every flag a heading
shows exists. Sections for commands the parser does not know (yet) are left alone."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from runner.cli import build_parser
from runner.cli.support import leaf_parsers

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
SHARED = "## Options shared by the client commands"
_HEADING = re.compile(r"^(#{2,3}) (.*)$")


def sections() -> list[tuple[str, str]]:
    """(heading, body) for each ## / ### section of cli.md."""
    found: list[tuple[str, list[str]]] = []
    for line in CLI_MD.read_text().splitlines():
        match = _HEADING.match(line)
        if match:
            found.append((match.group(2), []))
        elif found:
            found[-1][1].append(line)
    return [(heading, "\n".join(body)) for heading, body in found]


def commands_in(heading: str) -> list[str]:
    """The kl commands a heading documents: each `kl ...` code span, up to its first option or argument."""
    names = []
    for span in re.findall(r"`(kl [^`]*)`", heading):
        words = []
        for word in span.split()[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            words.append(word)
        names.append(" ".join(words))
    return names


def option_strings(leaf: argparse.ArgumentParser) -> list[list[str]]:
    return [a.option_strings for a in leaf._actions
            if a.option_strings and a.help is not argparse.SUPPRESS and "-h" not in a.option_strings]


def documented(command: str) -> tuple[str, str]:
    """Headings and text of every section naming ``command``."""
    chosen = [(h, b) for h, b in sections() if command in commands_in(h)]
    return "\n".join(h for h, _ in chosen), "\n".join(h + "\n" + b for h, b in chosen)


def test_every_command_and_option_of_the_parser_is_documented_under_its_heading():
    shared = CLI_MD.read_text().split(SHARED, 1)[1].split("\n## ", 1)[0]
    problems = []
    for leaf in leaf_parsers(build_parser()):
        command = leaf.prog.split(" ", 1)[1]
        headings, text = documented(command)
        if not headings:
            problems.append(f"no section for `kl {command}`")
            continue
        for options in option_strings(leaf):
            if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text + shared) for o in options):
                problems.append(f"`kl {command}`: {'/'.join(options)} is not documented")
    assert not problems, "docs/cli.md is out of date:\n" + "\n".join(problems)


def test_every_flag_a_heading_shows_exists_on_that_command():
    leaves = {leaf.prog.split(" ", 1)[1]: leaf for leaf in leaf_parsers(build_parser())}
    problems = []
    for heading, _ in sections():
        for span in re.findall(r"`(kl [^`]*)`", heading):
            command = commands_in(f"`{span}`")[0]
            leaf = leaves.get(command)
            if leaf is None:
                continue  # documented by another change, or a group heading: not this parser's business
            known = {o for a in leaf._actions for o in a.option_strings}
            for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", span):
                if flag not in known:
                    problems.append(f"`{span}` shows {flag}, which kl {command} does not have")
    assert not problems, "\n".join(problems)


def test_the_exit_codes_documented_are_the_ones_kl_uses():
    text = CLI_MD.read_text()
    for code, meaning in (("0", "success"), ("1", "failed"), ("2", "conflict or stale plan"), ("3", "usage")):
        assert re.search(rf"`{code}` [^`]*{meaning}", text), (code, meaning)
