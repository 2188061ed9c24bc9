"""A plan's actions counted as Terraform counts them, for ``kl plan --json`` and the line ``kl apply`` ends with."""

from __future__ import annotations

from collections.abc import Mapping


def terraform_counts(actions: Mapping[str, str]) -> dict[str, int]:
    """Counts as Terraform reports them: a replace is one added and one destroyed."""
    counts = {"add": 0, "change": 0, "destroy": 0, "replace": 0, "import": 0, "move": 0, "forget": 0}
    for action in actions.values():
        if action == "create":
            counts["add"] += 1
        elif action == "update":
            counts["change"] += 1
        elif action == "delete":
            counts["destroy"] += 1
        elif action == "replace":
            counts["replace"] += 1
            counts["add"] += 1
            counts["destroy"] += 1
        elif action in counts:
            counts[action] += 1
    return counts


def counts_line(actions: Mapping[str, str]) -> str:
    c = terraform_counts(actions)
    text = f"{c['add']} added, {c['change']} changed, {c['destroy']} destroyed"
    extra = [f"{c[k]} {label}" for k, label in (("replace", "replaced"), ("import", "imported"),
                                                 ("move", "moved"), ("forget", "forgotten")) if c[k]]
    return text + (f" ({', '.join(extra)})" if extra else "")
