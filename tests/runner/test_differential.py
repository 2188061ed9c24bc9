"""The differential equivalence check (bench/differential.py) on a few fixed seeds: every case converges with
vanilla Terraform or is refused with nothing written — never a silent divergence."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench.differential import Case
from tests.conftest import kl_terraform_bin

pytestmark = pytest.mark.terraform

SEEDS = (1, 2, 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_edit_converges_or_is_refused_without_writing(seed, live_server, tmp_path, terraform_factory):
    env = dict(terraform_factory("home").env)
    env.update(KL_DATA_DIR=str(tmp_path / "kl-data"), PATH=os.environ["PATH"], HOME=str(tmp_path))
    case = Case(seed, tmp_path / "case", live_server.state_url(f"diff{seed}"), env,
                str(Path(sys.executable).with_name("kl")), kl_terraform_bin())
    outcome = case.run()
    assert outcome.result in ("converged", "refused"), outcome
