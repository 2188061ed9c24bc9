"""The pins stage: what a plan file pins of the plan's inputs, and the check before an apply that none of
it moved since ``kl plan`` — the one place a moved configuration, input or write set becomes a ``StalePlan``.

A plan pins its configuration by the plan's mode (``PlanSpec.mode``): a full plan by one hash over the whole
configuration (``config_hash``), a file-scoped plan by the hash of each file its workspace was cut from
(``pin_files``), since the other files do not shape it. Both pin every variable input (``pin_variables``):
the variable-definitions files Terraform loads by itself, ``-var`` values (only a hash when sensitive),
``-var-file`` contents and ``TF_VAR_`` variables (hashes). ``verify`` checks all of it against the plan file;
``verify_replan`` checks that the re-plan under the run's reservations writes what the plan file says.

Must not: read the trunk or run Terraform (the re-plan under the run's reservations checks what moved there).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from app.domain.commit import is_data_source
from runner.core import workspace
from runner.core.errors import InvalidInput, StalePlan
from runner.core.spec import PinKind, PinnedVar, PlanMode, PlanSpec


def config_hash(config_dir: Path) -> str:
    """A full plan's pin of its configuration: one hash over every file that shapes the plan."""
    return workspace.config_hash(config_dir)


def pin_files(config_dir: Path, names: Iterable[str], trees: Iterable[Path]) -> dict[str, str]:
    """A file-scoped plan's pin of its configuration: the hash of each file its workspace was cut from, by
    name — ``names`` (relative to ``config_dir``), the provider lock file, and every file of the local module
    directories ``trees`` outside the configuration directory (Terraform's own ``.terraform`` left out)."""
    hashes = {name: workspace.file_hash(config_dir / name) for name in names}
    if (config_dir / workspace.LOCK_FILE).is_file():
        hashes[workspace.LOCK_FILE] = workspace.file_hash(config_dir / workspace.LOCK_FILE)
    config = config_dir.resolve()
    for root in trees:
        for path in sorted(root.rglob("*")):
            if path.is_file() and ".terraform" not in path.parts and not path.is_relative_to(config):
                hashes[os.path.relpath(path, config)] = workspace.file_hash(path)
    return hashes


def pin_variables(
    var_args: Sequence[tuple[str, str]], env: Mapping[str, str], sensitive: frozenset[str],
    config_dir: Path | None = None,
) -> tuple[PinnedVar, ...]:
    """Record every input the plan used: the variable-definitions files Terraform loads by itself (content
    hashes), -var values (hash only when sensitive), -var-file paths with content hashes, and TF_VAR_
    variables (hash only). Terraform's precedence among them is its own: kl passes them on unchanged."""
    pinned: list[PinnedVar] = []
    for path in workspace.auto_var_files(config_dir) if config_dir is not None else ():
        pinned.append(PinnedVar(PinKind.AUTO_VAR_FILE, str(path.resolve()), workspace.file_hash(path)))
    for kind, raw in var_args:
        if kind == "var":
            name, _, value = raw.partition("=")
            digest = hashlib.sha256(value.encode()).hexdigest()
            pinned.append(PinnedVar(PinKind.VAR, name, digest, None if name in sensitive else value))
        else:
            path = Path(raw).resolve()
            if not path.is_file():
                raise InvalidInput(f"-var-file {raw}: no such file")
            pinned.append(PinnedVar(PinKind.VAR_FILE, str(path), workspace.file_hash(path)))
    for key in sorted(k for k in env if k.startswith("TF_VAR_")):
        pinned.append(PinnedVar(PinKind.ENV, key, hashlib.sha256(env[key].encode()).hexdigest()))
    return tuple(pinned)


def verify(spec: PlanSpec, config_dir: Path, env: Mapping[str, str], supplied: Mapping[str, str]) -> None:
    """Refuse (exit 2: re-plan) when the configuration the plan pinned (by its mode) or a pinned input moved
    since kl plan; ``supplied`` holds the sensitive values given again (exit 3 when one is missing)."""
    if spec.mode == PlanMode.FILES:
        _verify_files(spec, config_dir)
    elif config_hash(config_dir) != spec.config_hash:
        raise StalePlan(f"the configuration in {config_dir} changed since kl plan: re-run kl plan")
    _verify_variables(spec, env, supplied)


def verify_replan(spec: PlanSpec, writes: Iterable[str]) -> None:
    """Refuse (exit 2: re-plan) when the re-plan under the run's reservations writes other addresses than the
    plan file says. Data sources are compared by neither side: what one reads may change between the plan and
    now, and the commit takes whatever the apply read for those under the write globs."""
    replanned = {a for a in writes if not is_data_source(a)}
    planned = {a for a in spec.write_set if not is_data_source(a)}
    if replanned != planned:
        extra, missing = sorted(replanned - planned), sorted(planned - replanned)
        raise StalePlan(f"the re-plan over the trunk slice differs from kl-plan.json (new: {extra[:10]}, gone: "
                        f"{missing[:10]}); nothing was applied: re-run kl plan")


def _verify_files(spec: PlanSpec, config_dir: Path) -> None:
    """Each file the workspace was cut from is as kl plan -f found it, and no variable-definitions file
    Terraform loads by itself appeared."""
    for name, digest in spec.files.items():
        path = config_dir / name
        if not path.is_file() or workspace.file_hash(path) != digest:
            raise StalePlan(f"{name} changed since kl plan -f: re-run kl plan -f")
    for path in workspace.auto_var_files(config_dir):
        if path.name not in spec.files:
            raise StalePlan(f"{path.name} appeared since kl plan -f (Terraform loads it by itself): re-run kl plan -f")


def _verify_variables(spec: PlanSpec, env: Mapping[str, str], supplied: Mapping[str, str]) -> None:
    pinned_env = {v.name for v in spec.variables if v.kind == PinKind.ENV}
    for key in sorted(k for k in env if k.startswith("TF_VAR_") and k not in pinned_env):
        raise StalePlan(f"{key} is set but was not when kl plan ran: re-run kl plan")
    for var in spec.variables:
        if var.kind in (PinKind.VAR_FILE, PinKind.AUTO_VAR_FILE):
            path = Path(var.name)
            if not path.is_file() or workspace.file_hash(path) != var.sha256:
                raise StalePlan(f"{var.name} changed or vanished since kl plan (the variable values differ): "
                                "re-run kl plan")
        elif var.kind == PinKind.ENV:
            if hashlib.sha256(env.get(var.name, "").encode()).hexdigest() != var.sha256:
                raise StalePlan(f"{var.name} differs from what kl plan saw: re-run kl plan")
        elif var.value is None:
            given = supplied.get(var.name)
            if given is None:
                raise InvalidInput(f"variable {var.name} is sensitive and not stored in the plan file: pass it "
                                   f"again with -var {var.name}=... or TF_VAR_{var.name}")
            if hashlib.sha256(given.encode()).hexdigest() != var.sha256:
                raise StalePlan(f"variable {var.name} differs from what kl plan used: re-run kl plan")
