"""kl completion: the bash script, run by a real bash, completes every command path and every option the
parser has, option choices and file arguments; zsh reuses it, fish lists the same words."""

from __future__ import annotations

import argparse
import shlex
import subprocess

import pytest

from runner.cli import build_parser, main
from runner.cli.completion import nodes


def script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def complete(bash_script: str, lines: list[list[str]], cwd: str = ".") -> list[list[str]]:
    """What the bash completion offers for each command line (the last word is the one being completed)."""
    calls = "".join(f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
                    "COMPREPLY=(); _kl; echo \"${COMPREPLY[*]}\"\n" for words in lines)
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", bash_script + calls], capture_output=True,
                          text=True, timeout=120, cwd=cwd, check=True)
    return [line.split() for line in done.stdout.splitlines()]


def test_bash_completes_commands_subcommands_choices_and_files(capsys, tmp_path):
    (tmp_path / "kl-plan.json").write_text("{}")
    found = complete(script("bash", capsys), [
        ["kl", "st"], ["kl", "state", ""], ["kl", "serve", "--p"], ["kl", "runs", "--status", "f"],
        ["kl", "tokens", "create", "acme", "--w"], ["kl", "completion", ""], ["kl", "apply", "kl-pl"],
        ["kl", "runs", ""], ["kl", "nonsense", "--"]], cwd=str(tmp_path))
    assert found == [["states", "state"], ["ls", "history"], ["--port"], ["failed"], ["--workspace"],
                     ["bash", "zsh", "fish"], ["kl-plan.json"], ["show"], ["--help", "--version"]]


def test_bash_offers_every_option_of_every_command(capsys):
    table = [n for n in nodes(build_parser()) if n.path]
    lines = [["kl", *n.path.split(), "-"] for n in table]
    offered = complete(script("bash", capsys), lines)
    for node, words in zip(table, offered, strict=True):
        assert sorted(words) == sorted(o for o, _ in node.options), node.path


def test_zsh_reuses_the_bash_completion_and_fish_lists_every_command_and_option(capsys):
    bash, zsh, fish = (script(shell, capsys) for shell in ("bash", "zsh", "fish"))
    assert zsh.startswith("#compdef kl\n") and "bashcompinit" in zsh
    assert bash.split("\n", 1)[1] in zsh
    parser = build_parser()
    for node in nodes(parser):
        for command, _ in node.commands:
            assert f" -a {shlex.quote(command)} " in fish, command
        for option, _ in node.options:
            flag = f"-l {option[2:]}" if option.startswith("--") else f"-o {option[1:]}"
            assert flag in fish, (node.path, option)
    assert any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    assert "-n '__fish_seen_subcommand_from tokens && __fish_seen_subcommand_from create' -l workspace" in fish
