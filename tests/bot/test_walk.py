"""The two walks of ``bench/walk.py``: one ``kl apply -f FILE --confirm-scope`` and one bot merge apply, each run in
this process under ``sys.setprofile``. Each must succeed; the numbers are written where ``KL_WALK_OUT`` says."""

from __future__ import annotations

import os

import pytest

from bench.walk import ENV_OUT, Walk, save
from runner.cli import main as kl
from tests.bot.botworld import FILES, world_factory  # noqa: F401
from tests.runner.test_file_scoped import make_repo

pytestmark = pytest.mark.terraform


def test_the_walk_of_a_file_scoped_apply(live_server, workdir_factory, monkeypatch, capsys):
    repo = make_repo(live_server, workdir_factory)
    repo.edit("db.tf", "db-v1", "db-v2")
    for key in list(os.environ):
        if key.startswith(("KL_", "TF_")) and key != ENV_OUT:
            monkeypatch.delenv(key)
    for key, value in repo.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(repo.dir)
    walk = Walk()
    with walk.recording():
        code = kl(["apply", "-f", "db.tf", "--confirm-scope", "--actor", "alice"])
    out = capsys.readouterr()
    assert code == 0 and "committed at serial" in out.out, out.out + out.err
    save("kl apply -f db.tf --confirm-scope", walk)


def test_the_walk_of_a_bot_merge_apply(world_factory):  # noqa: F811
    w = world_factory()
    w.open_pr(1, "db-v2", {"db.tf": FILES["db.tf"].replace("db-v1", "db-v2")})
    w.run_jobs()
    w.merge(1)
    walk = Walk()
    with walk.recording():
        w.run_jobs()
    [run] = [r for r in w.runs() if r["status"] == "committed"]
    assert run["committed_serial"] == 2, run
    save("bot merge apply", walk)
