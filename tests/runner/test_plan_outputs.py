"""kl plan reserves, for writing, every root output its plan adds, changes or removes."""

from __future__ import annotations

from analyzer.globs import parse_glob
from runner.core.plan import output_write_globs


def test_changed_outputs_become_output_write_globs() -> None:
    found = output_write_globs({"web": "update", "gone": "delete", "new": "create"})
    assert found == {"output.web", "output.gone", "output.new"}
    assert all(parse_glob(g).is_output for g in found)


def test_a_name_that_is_not_an_identifier_widens_to_every_output() -> None:
    assert output_write_globs({"bad name": "update", "ok": "update"}) == {"output.*", "output.ok"}
    assert output_write_globs({}) == set()
