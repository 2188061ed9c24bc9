"""The differential equivalence check (bench/differential.py) on a few fixed seeds: every case converges with
vanilla Terraform or is refused with nothing written — never a silent divergence. The cloud seeds hold real
objects (the fakecloud provider) and edit them: deletions with and without ``removed`` blocks, removed root
outputs, a module renamed with ``moved``, a data source reading a changed bucket, a deleted file."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from bench.differential import CLOUD_EDITS, Case, edit, generate
from tests.conftest import kl_terraform_bin

pytestmark = pytest.mark.terraform

SEEDS = (1, 2, 3)
# Chosen so that together they cover every cloud edit, with -f and with --changed-from (checked below).
CLOUD_SEEDS = (5, 13, 43)


def _case(seed, live_server, tmp_path, terraform_factory, cloud=None) -> Case:  # type: ignore[no-untyped-def]
    env = dict(terraform_factory("home").env)
    env.update(KL_DATA_DIR=str(tmp_path / "kl-data"), PATH=os.environ["PATH"], HOME=str(tmp_path))
    return Case(seed, tmp_path / "case", live_server.state_url(f"diff{seed}"), env,
                str(Path(sys.executable).with_name("kl")), kl_terraform_bin(), cloud=cloud)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_edit_converges_or_is_refused_without_writing(seed, live_server, tmp_path, terraform_factory):
    outcome = _case(seed, live_server, tmp_path, terraform_factory).run()
    assert outcome.result in ("converged", "refused"), outcome


def test_the_cloud_seeds_cover_every_edit_of_real_objects():
    covered = set()
    for seed in CLOUD_SEEDS:
        rnd = random.Random(seed)
        covered.update(edit(generate(rnd, cloud=True), rnd)[1])
    assert set(CLOUD_EDITS) <= covered, set(CLOUD_EDITS) - covered


@pytest.mark.parametrize("seed", CLOUD_SEEDS)
def test_deletions_moves_and_data_sources_of_real_objects_converge(seed, live_server, tmp_path, terraform_factory,
                                                                   fakecloud):
    outcome = _case(seed, live_server, tmp_path, terraform_factory, cloud=fakecloud).run()
    assert outcome.result == "converged", outcome
