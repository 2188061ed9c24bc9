"""``kl completion bash|zsh|fish``: shell completion scripts generated from the parser itself, so every
command, subcommand, option and option choice kl has is completed, and nothing it does not have.

The scripts are static (they never run kl while completing): a table of each command path's words, read
by a small completion function. zsh uses the bash script through its ``bashcompinit``.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from runner.cli.support import EXIT_OK, Commands

SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True, slots=True)
class Node:
    """One command path (``""`` for kl itself, ``"tokens create"``): its subcommands with their help, its
    options with their help, and the choices of the options that have some."""

    path: str
    commands: tuple[tuple[str, str], ...]
    options: tuple[tuple[str, str], ...]
    choices: tuple[tuple[str, tuple[str, ...]], ...]
    values: tuple[str, ...] = ()  # the choices of its positional arguments (kl completion SHELL)


def nodes(parser: argparse.ArgumentParser, path: str = "") -> list[Node]:
    """Every command path of the parser, depth first."""
    commands: list[tuple[str, str]] = []
    children: list[tuple[str, argparse.ArgumentParser]] = []
    options: list[tuple[str, str]] = []
    choices: list[tuple[str, tuple[str, ...]]] = []
    values: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                commands.append((name, helps.get(name, "")))
                children.append((name, sub))
        elif action.option_strings and action.help is not argparse.SUPPRESS:
            for option in action.option_strings:
                options.append((option, action.help or ""))
                if action.choices:
                    choices.append((option, tuple(str(c) for c in action.choices)))
        elif not action.option_strings and action.choices:
            values.extend(str(c) for c in action.choices)
    found = [Node(path, tuple(commands), tuple(options), tuple(choices), tuple(values))]
    for name, sub in children:
        found.extend(nodes(sub, f"{path} {name}".strip()))
    return found


def bash_script(parser: argparse.ArgumentParser) -> str:
    table = nodes(parser)
    def key(*words: str) -> str:
        return shlex.quote(" ".join(w for w in words if w))

    def line(n: Node, found: list[str]) -> str:
        return f"        {key(n.path) if n.path else chr(39) * 2}) echo {shlex.quote(' '.join(found))} ;;"

    words = "\n".join(line(n, [c for c, _ in n.commands] + list(n.values)) for n in table)
    flags = "\n".join(line(n, [o for o, _ in n.options]) for n in table)
    picks = "\n".join(f"        {key(n.path, option)}) echo {shlex.quote(' '.join(values))} ;;"
                      for n in table for option, values in n.choices)
    commands = "\n".join(f"        {key(n.path, c)}) return 0 ;;" for n in table for c, _ in n.commands)
    return f"""# kl completion for bash: eval "$(kl completion bash)" in ~/.bashrc
_kl_words() {{
    case "$1" in
{words}
    esac
}}
_kl_options() {{
    case "$1" in
{flags}
    esac
}}
_kl_choices() {{
    case "$1" in
{picks}
        *) return 1 ;;
    esac
}}
_kl_is_command() {{
    case "$1" in
{commands}
    esac
    return 1
}}
_kl() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" path="" i word values
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if _kl_is_command "${{path:+$path }}$word"; then path="${{path:+$path }}$word"; fi
    done
    if values="$(_kl_choices "${{path:+$path }}$prev")"; then
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_kl_options "$path")" -- "$cur"))
        return 0
    fi
    COMPREPLY=($(compgen -W "$(_kl_words "$path")" -- "$cur"))
    if [ ${{#COMPREPLY[@]}} -eq 0 ]; then  # an argument such as FILE or a plan file
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _kl kl
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return ("#compdef kl\n# kl completion for zsh: eval \"$(kl completion zsh)\" in ~/.zshrc (uses the bash "
            "completion through bashcompinit)\nautoload -U +X bashcompinit && bashcompinit\n"
            + bash_script(parser).split("\n", 1)[1])


def fish_script(parser: argparse.ArgumentParser) -> str:
    lines = ["# kl completion for fish: kl completion fish > ~/.config/fish/completions/kl.fish",
             "complete -c kl -f"]
    for node in nodes(parser):
        words = node.path.split()
        seen = " && ".join(f"__fish_seen_subcommand_from {w}" for w in words)
        subs = " ".join(c for c, _ in node.commands)
        if node.path:
            condition = seen + (f" && not __fish_seen_subcommand_from {subs}" if subs else "")
        else:
            condition = "__fish_use_subcommand"
        for value in node.values:
            lines.append(f"complete -c kl -n {shlex.quote(condition)} -a {shlex.quote(value)}")
        for command, text in node.commands:
            lines.append(f"complete -c kl -n {shlex.quote(condition)} -a {shlex.quote(command)} "
                         f"-d {shlex.quote(text)}")
        picks = dict(node.choices)
        for option, text in node.options:
            flag = f"-l {option[2:]}" if option.startswith("--") else f"-o {option[1:]}"
            extra = f" -x -a {shlex.quote(' '.join(picks[option]))}" if option in picks else ""
            lines.append(f"complete -c kl -n {shlex.quote(condition)} {flag}{extra} -d {shlex.quote(text)}")
    return "\n".join(lines) + "\n"


def cmd_completion(args: argparse.Namespace) -> int:
    whole: Callable[[], argparse.ArgumentParser] = args.kl_whole_parser
    script = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[args.shell](whole())
    print(script, end="")
    return EXIT_OK


def register(sub: Commands, whole: Callable[[], argparse.ArgumentParser]) -> None:
    """Add kl completion to the ``kl`` subcommands; ``whole`` builds the parser the scripts describe (the
    entry point's, which registers this one)."""
    p = sub.add_parser("completion", help="print a shell completion script for bash, zsh or fish",
                       description="Print a completion script for kl's commands, subcommands and options. "
                                   'bash: eval "$(kl completion bash)" in ~/.bashrc; zsh: eval "$(kl completion '
                                   'zsh)" in ~/.zshrc; fish: kl completion fish > ~/.config/fish/completions/kl.fish')
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    p.set_defaults(func=cmd_completion, kl_whole_parser=whole)
