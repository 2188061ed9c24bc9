"""A merge apply on a configuration whose untouched root outputs and attributes hold values of every JSON
shape — lists, maps, objects, numbers, nulls, unicode, sensitive — commits, and the trunk is what a full apply
would have produced. The bot goes through the same dry commit and commit as ``kl apply``; this proves it."""

from __future__ import annotations

import pytest

from tests.bot.botworld import FILES, world_factory  # noqa: F401
from tests.bot.test_jobs_merges import DB_V2, converged, jobs_of

pytestmark = pytest.mark.terraform

SHAPES = '''resource "terraform_data" "shaped" {
  input = {
    list  = ["a", "ü", 1.5, true]
    map   = { k = "v", n = null, "key with spaces" = "ß" }
    big   = 12345678901234567890
    empty = []
    none  = {}
  }
}

output "ids" {
  value = [terraform_data.queue.id, terraform_data.shaped.id]
}

output "by_name" {
  value = { queue = terraform_data.queue.output, shaped = terraform_data.shaped.output }
}

output "numbers" {
  value = [1, 1.0, 2.5, 1e3, -0]
}

output "nothing" {
  value = null
}

output "secret" {
  value     = { token = "s3cr3t", ids = [1, 2] }
  sensitive = true
}
'''


def test_a_merge_applies_beside_outputs_of_every_shape_and_converges(world_factory):  # noqa: F811
    w = world_factory(files={**FILES, "shapes.tf": SHAPES})
    base_serial = w.serial()
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()

    w.merge(1)
    w.run_jobs()

    apply = jobs_of(w, "apply_project")[-1].result["apply"]
    assert apply["status"] == "committed", apply
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2" and w.serial() == base_serial + 1
    [run] = [r for r in w.runs() if r["status"] == "committed"]
    assert run["committed_serial"] == base_serial + 1
    converged(w)
