"""The PR comment and the check outputs, rendered from stored outcomes: golden bodies, folding, GitHub's
size limits, and the JSON round trip the jobs rely on."""

from __future__ import annotations

import pytest

from runner.bot.outcomes import (
    ApplyResult,
    FootprintOutcome,
    LiveConflict,
    Overlap,
    PreviewOutcome,
    ProjectFootprint,
    ProjectPreview,
    apply_from_json,
    compact_shared,
    footprint_from_json,
    preview_from_json,
    to_json,
)
from runner.bot.render import (
    BODY_BUDGET,
    GITHUB_LIMIT,
    MARKER,
    CommentView,
    apply_check,
    counts,
    footprint_check,
    plan_check,
    render_comment,
)
from tests.bot.golden import assert_golden

HEAD, MERGE = "3f2a9c1e" + "0" * 32, "9e8d7c6b" + "1" * 32
PROD = ProjectFootprint(
    name="prod", dir="infra/prod", state="prod", changed=("infra/prod/db.tf", "infra/prod/network.tf"),
    files=("db.tf", "network.tf", "web.tf", "old.tf (deleted)"),
    write_globs=("terraform_data.db", "terraform_data.db.*", "terraform_data.net", "terraform_data.net.*"),
    read_globs=("module.app.*",),
    diagnostics=("widened to web.tf: terraform_data.web[0] depends on terraform_data.net, which this change writes",
                 "db.tf:7: remote_state: the data source is copied and read"),
    conflicts=(LiveConflict("terraform_data.db.*", "write", "*", "write", "alice@laptop"),
               LiveConflict("terraform_data.net.*", "write", "terraform_data.net.*", "read", "bob", "ar_0123456789ab")),
)
STAGING = ProjectFootprint(name="staging", dir="infra/staging", state="staging", changed=("staging.auto.tfvars",),
                           error="cannot scope the change safely:\n  infra/staging/staging.auto.tfvars: variable "
                                 "values changed\nrun kl plan without -f (a full plan)")
ACTIONS = tuple(sorted([(f"terraform_data.web[{i}]", "update") for i in range(14)]
                       + [("terraform_data.db", "replace"), ("terraform_data.net", "update"),
                          ("terraform_data.cache", "create"), ("terraform_data.old", "delete")]))
FOOTPRINT = FootprintOutcome(HEAD, "1b2c3d4e" + "2" * 32, (PROD, STAGING), config_source=".kilolock.yml")
PREVIEW = PreviewOutcome(HEAD, (ProjectPreview("prod", "prod", 41, ACTIONS, (("db_endpoint", "update"),),
                                               ("widened to web.tf: …",)),))
OVERLAPS = {"prod": (Overlap(12, ("terraform_data.db.*",)), Overlap(15, ("terraform_data.net ∩ terraform_data.net.*",
                                                                          "module.app.*")))}


def test_the_comment_for_an_open_pull_request(request):
    body = render_comment(CommentView("octo-org/infra", 14, FOOTPRINT, PREVIEW, False, (), OVERLAPS))
    assert body.startswith(MARKER + "\n")
    assert_golden(request, "open.md", body)


def test_the_comment_while_the_preview_runs_and_after_a_failed_one(request):
    running = render_comment(CommentView("octo-org/infra", 14, FootprintOutcome(HEAD, "", (PROD,)), None, True))
    failed = render_comment(CommentView("octo-org/infra", 14, FootprintOutcome(HEAD, "", (PROD,)), PreviewOutcome(
        HEAD, (ProjectPreview("prod", "prod", error="terraform plan failed (exit 1):\nError: Invalid reference"),))))
    assert "**Plan preview:** running…" in running
    assert_golden(request, "preview-failed.md", failed)


def test_the_comment_after_the_merge(request):
    applies = (ApplyResult("prod", "prod", MERGE, "committed", 42, "ar_1ed6adbb6d3bc95d", ACTIONS[:3],
                           waited_seconds=8.4),
               ApplyResult("staging", "staging", MERGE, "failed", None, "ar_77aa00bb11cc22dd",
                           error="terraform apply failed (exit 1):\nError: local-exec provisioner error",
                           hint="fix the configuration in a new pull request"))
    body = render_comment(CommentView("octo-org/infra", 14, FOOTPRINT, PREVIEW, False, applies, {}, merged_sha=MERGE))
    assert_golden(request, "merged.md", body)


def test_invalid_configuration_and_no_projects():
    invalid = render_comment(CommentView("o/r", 1, FootprintOutcome(HEAD, config_errors=(
        "projects[0]: dir 'x' does not exist in this commit",), config_source=".kilolock.yml")))
    assert "**`.kilolock.yml` is invalid**" in invalid and "- projects[0]: dir 'x' does not exist" in invalid
    nothing = render_comment(CommentView("o/r", 1, FootprintOutcome(HEAD)))
    assert "changes no file of a Kilolock project" in nothing


def test_long_lists_fold_and_a_huge_plan_stays_under_githubs_limit():
    huge = tuple((f'module.fleet["{i:05d}"].terraform_data.node[{i}]', "create") for i in range(20_000))
    body = render_comment(CommentView("o/r", 1, FootprintOutcome(HEAD, "", (PROD,)),
                                      PreviewOutcome(HEAD, (ProjectPreview("prod", "prod", 1, huge),))))
    assert len(body) <= BODY_BUDGET < GITHUB_LIMIT
    assert "**Plan preview** against serial 1: 20000 to create" in body
    assert body.count("<details>") == body.count("</details>") >= 1
    assert "more (see the check run)" in body
    check = plan_check(PreviewOutcome(HEAD, (ProjectPreview("prod", "prod", 1, huge),)))
    assert len(check.summary) <= GITHUB_LIMIT and check.text is not None and len(check.text) <= GITHUB_LIMIT
    assert check.text.count("```") % 2 == 0


def test_addresses_with_backticks_stay_inline_code():
    body = render_comment(CommentView("o/r", 1, FootprintOutcome(HEAD, "", (
        ProjectFootprint("p", "", "s", write_globs=('terraform_data.x["a`b"]',)),))))
    assert '| write | ``terraform_data.x["a`b"]`` |' in body


def test_the_check_outputs():
    fp = footprint_check(FOOTPRINT, OVERLAPS)
    assert (fp.conclusion, fp.title) == ("failure", "1 project(s) cannot be scoped to the changed files")
    ok = footprint_check(FootprintOutcome(HEAD, "", (PROD,)), OVERLAPS)
    assert (ok.conclusion, ok.title) == ("success", "4 write and 1 read reservation(s) predicted; overlaps #12, #15")
    assert footprint_check(FootprintOutcome(HEAD), {}).conclusion == "neutral"
    plan = plan_check(PREVIEW)
    assert (plan.conclusion, plan.title) == ("success", "plan: 1 to create, 15 to update, 1 to replace, 1 to delete")
    applied = apply_check([ApplyResult("prod", "prod", MERGE, "committed", 42, "ar_1", ACTIONS[:2])])
    assert (applied.conclusion, applied.title) == ("success", "applied: prod at serial 42")
    failed = apply_check([ApplyResult("prod", "prod", MERGE, "failed", error="boom", hint="retry")])
    assert (failed.conclusion, failed.title) == ("failure", "apply failed for prod; the trunk is unchanged")
    assert "What to do: retry" in failed.summary
    assert counts(()) == "no changes"


def test_shared_globs_are_named_once():
    assert compact_shared(["a.x", "a.x ∩ a.x.*", "a.x.*", "b.y ∩ b.y.*"]) == ("a.x", "a.x.*", "b.y ∩ b.y.*")


@pytest.mark.parametrize("outcome, load", [
    (FOOTPRINT, footprint_from_json),
    (PREVIEW, preview_from_json),
    (ApplyResult("prod", "prod", MERGE, "committed", 3, "ar_1", ACTIONS[:2], waited_seconds=1.5), apply_from_json),
])
def test_outcomes_survive_the_json_round_trip_through_bot_jobs(outcome, load):
    import json

    assert load(json.loads(json.dumps(to_json(outcome)))) == outcome
