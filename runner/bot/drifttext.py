"""The Markdown of scheduled drift checks: the ``kilolock/drift`` check run (or commit status) and the
drift issue of a project, rendered from a stored drift outcome (``runner.bot.drift_schedule``).

Addresses and attribute **names** only: a stored outcome never holds values, and nothing here adds
any. Must not: talk to GitHub, the database or Terraform.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from analyzer.plan_drift import DriftedInstance
from runner.bot.markdown import block, cell, code, marker, prose
from runner.bot.outcomes import DriftOutcome
from runner.bot.render import CheckOutput

MAX_ROWS = 200


def issue_marker(project: str) -> str:
    """The hidden marker that finds a project's drift issue again."""
    return marker("drift", project)


def _when(window: int) -> str:
    return datetime.fromtimestamp(window, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _table(drifted: Sequence[DriftedInstance]) -> str:
    lines = ["| instance | what changed outside Terraform | last change Kilolock recorded |", "|---|---|---|"]
    for item in drifted[:MAX_ROWS]:
        what = ("gone: the object was deleted" if item.gone
                else ", ".join(cell(a) for a in item.attributes) or "(attributes)")
        lines.append(f"| {cell(item.address)} | {what} | {cell(item.last_change) if item.last_change else 'none'} |")
    if len(drifted) > MAX_ROWS:
        lines.append(f"| … | {len(drifted) - MAX_ROWS} more drifted instance(s) not shown | |")
    return "\n".join(lines)


def _where(d: DriftOutcome) -> str:
    return f"project {code(d.project)} (state {code(d.state)}) on {code(d.branch)} at {prose(d.sha[:12])}"


def _next_steps(d: DriftOutcome) -> str:
    return ("To accept what the objects are now, commit it to the trunk with `kl refresh` (add `--target ADDRESS` "
            f"for one instance) in {code(d.shown_dir)}; to put them back as configured, run `kl apply`. Values "
            "are never shown here: run `kl drift` where you may see them.")


def check_output(d: DriftOutcome) -> CheckOutput:
    """The ``kilolock/drift`` check of one project's window: success when clean, failure when drifted or
    when the check could not run."""
    window = _when(d.window)
    if d.error:
        return CheckOutput("failure", f"drift check of {d.project} failed",
                           f"The scheduled drift check of {_where(d)} (window {window}) could not run:\n\n"
                           f"{block(d.error)}\n\nIt runs again in the next window.")
    if not d.drifted:
        return CheckOutput("success", f"no drift in {d.project} ({d.checked} instance(s) checked)",
                           f"The objects of {_where(d)} match the trunk at serial {d.serial} "
                           f"(window {window}).")
    return CheckOutput("failure", f"{len(d.drifted)} drifted instance(s) in {d.project}",
                       f"Drift in {_where(d)}: the trunk at serial {d.serial} no longer describes these objects "
                       f"(window {window}, {d.checked} instance(s) checked).\n\n{_table(d.drifted)}\n\n"
                       f"{_next_steps(d)}")


def issue_title(d: DriftOutcome) -> str:
    return f"Kilolock: drift in {d.project} ({d.state})"


def issue_body(d: DriftOutcome) -> str:
    """The issue while drift lasts (edited every window), or the closing text once a window is clean."""
    window = _when(d.window)
    if not d.drifted:
        return (f"No drift any more: the scheduled check of {_where(d)} found the objects matching the trunk at "
                f"serial {d.serial} (window {window}). Kilolock closed this issue and reopens it if drift "
                "comes back.")
    return (f"The scheduled drift check of {_where(d)} found {len(d.drifted)} instance(s) that changed outside "
            f"Terraform (trunk serial {d.serial}, last checked in the window of {window}). Kilolock edits this "
            f"issue every window and closes it when the drift clears.\n\n{_table(d.drifted)}\n\n{_next_steps(d)}")
