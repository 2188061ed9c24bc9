"""What kl drift prints of its scope: each glob once, a file-scoped resource pair (X and X.*) as X."""

from __future__ import annotations

from runner.core.drift import DriftResult, describe, shown_globs


def test_a_file_scoped_resource_pair_is_shown_once_and_other_globs_as_they_are():
    globs = ("module.db.*", "terraform_data.web", "terraform_data.web.*", "terraform_data.webapp.*")
    assert shown_globs(globs) == ("module.db.*", "terraform_data.web", "terraform_data.webapp.*")
    result = DriftResult(state="prod", serial=4, checked=3, globs=globs, drifted=(), run_id="ar_1")
    first = describe(result)[0]
    assert first.endswith("checked under module.db.*, terraform_data.web, terraform_data.webapp.*")
    assert first.count("terraform_data.web,") == 1
    assert shown_globs(("*",)) == ("*",)
