"""Owners of address globs: the rule (last match wins, structural, fail closed), ``owners:`` validation with
line numbers, and ``owners_approved`` end to end — comment applies and merge applies on the real server with
real Terraform, GitHub's reviews and team memberships simulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.bot.config import BotConfigError, RawConfig, parse, validate
from runner.bot.github import forget_cached_installations
from runner.bot.owners import Owner, OwnerRule, owned, parse_owner
from tests.bot.botworld import FILES, REPO, World, world_factory  # noqa: F401
from tests.bot.test_apply_before_merge import comment, marked, replies, reservations

DBA, PLATFORM = Owner("octo-org", "dba"), Owner("octo-org", "platform")


def rules(*pairs: tuple[str, tuple[Owner, ...]]) -> tuple[OwnerRule, ...]:
    return tuple(OwnerRule(g, o) for g, o in pairs)


def test_the_last_matching_rule_owns_an_address_and_an_empty_rule_unowns_it():
    r = rules(("*", (PLATFORM,)), ("module.payments.*", (DBA,)), ("module.payments.aws_s3_bucket.logs", ()))
    assert owned(r, "module.payments.aws_iam_role.x").groups == ((DBA,),)
    assert owned(r, "module.payments.aws_s3_bucket.logs").groups == ()
    assert owned(r, "aws_vpc.main").groups == ((PLATFORM,),)
    # Structural, not text: module.paymentsx is not inside module.payments.
    assert owned(r, "module.paymentsx.aws_iam_role.x").groups == ((PLATFORM,),)
    # A write glob wider than a later rule needs every rule whose addresses it may write.
    assert owned(r, "module.payments.*").groups == ((DBA,),)
    assert owned(r, "*").groups == ((PLATFORM,), (DBA,))


def test_rules_that_only_together_cover_a_glob_still_count_and_unparsable_globs_need_everyone():
    r = rules(("module.a.*", (PLATFORM,)), ("module.a.aws_x.one", (DBA,)), ("module.a.aws_x.two", (DBA,)))
    assert owned(r, "module.a.aws_x.one").groups == ((DBA,),)
    assert owned(r, "module.a.aws_x.*").groups == ((PLATFORM,), (DBA,))
    bad = owned(r, "module.a[")
    assert bad.unparsable and bad.groups == ((PLATFORM,), (DBA,))


def test_owner_handles_are_users_or_org_teams():
    assert parse_owner("@alice") == Owner("alice") and parse_owner("@acme/pay_ments") == Owner("acme", "pay_ments")
    for bad in ("alice", "@", "@-x", "@a/b/c", "@al ice", "acme/team"):
        with pytest.raises(ValueError):
            parse_owner(bad)


def test_owners_validation_names_the_line_of_each_problem(tmp_path: Path):
    (tmp_path / "main.tf").write_text('terraform {\n  backend "http" {\n    address = "http://x/v1/states/infra"\n'
                                      '  }\n}\n')
    text = ('apply_requirements: [owners_approved]\nowners:\n  "*": "@octo-org/platform"\n'
            '  "module.pay ments.*": "@octo-org/payments"\n  "aws_iam_role.*": "security"\nprojects:\n'
            '  - dir: .\n    owners:\n      "terraform_data.db": "@octo-org/dba"\n'
            '      "terraform_data.db": "@carol"\n')
    with pytest.raises(BotConfigError) as caught:
        validate(RawConfig(".kilolock.yml", parse(text), text), tmp_path)
    problems = caught.value.problems
    assert any(p.startswith("line 4: owners: invalid address glob 'module.pay ments.*'") for p in problems), problems
    assert any(p.startswith("line 5: owners: owner 'security' is not a GitHub user") for p in problems), problems
    assert any(p.startswith("line 10: projects[0]: owners: 'terraform_data.db' is listed again (first on line 9)")
               for p in problems), problems
    good = text.replace("pay ments", "payments").replace('"security"', '["@alice", "@octo-org/security"]')
    good = good.replace('      "terraform_data.db": "@carol"\n', '      "terraform_data.db.*": []\n')
    [project] = validate(RawConfig(".kilolock.yml", parse(good), good), tmp_path).projects
    assert [(r.glob, tuple(map(str, r.owners)), r.line) for r in project.owners] == [
        ("*", ("@octo-org/platform",), 3), ("module.payments.*", ("@octo-org/payments",), 4),
        ("aws_iam_role.*", ("@alice", "@octo-org/security"), 5), ("terraform_data.db", ("@octo-org/dba",), 9),
        ("terraform_data.db.*", (), 10)]


def test_owners_problem_counts_only_member_writers_approving_the_head_who_are_not_the_author():
    from runner.bot.github import Review
    from runner.bot.requirements import owners_problem

    head, old = "a" * 40, "b" * 40
    need = (owned(rules(("*", (PLATFORM,)), ("module.db.*", (DBA, Owner("alice")))), "module.db.terraform_data.x"),)
    members = {"carol": {DBA}, "mallory": {DBA}}

    def problem(*reviews: tuple[str, str], author: str = "bob") -> str | None:
        found = [Review(login, "APPROVED", commit, "2026-12-01T10:00:00Z") for login, commit in reviews]
        return owners_problem(need, found, author=author, head_sha=head, writers=frozenset({"alice", "bob", "carol"}),
                              is_member=lambda login, owner: owner in members.get(login, set()), quote=str)

    assert problem(("carol", head)) is None
    assert problem(("alice", head)) is None  # a user owner approves for the group
    assert problem(("alice", head), author="alice") is not None  # not for their own pull request
    assert problem(("carol", old)) is not None  # stale: before the latest push
    assert problem(("mallory", head)) is not None  # a member without write access
    assert problem(("bob", head)) == ("no approval of the head aaaaaaa by a member of @octo-org/dba or @alice (for "
                                      "module.db.terraform_data.x): ask one member with write access of each to "
                                      "approve the current head")


# --- end to end ---------------------------------------------------------------------------------------

DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")
OWNERS = ('owners:\n  "*": "@octo-org/platform"\n  "terraform_data.db": "@octo-org/dba"\n'
          '  "terraform_data.db.*": "@octo-org/dba"\n')


def owned_world(world_factory, gate: str) -> World:  # noqa: F811
    forget_cached_installations()  # memberships are cached per process
    w = world_factory(kilolock_yml=gate + OWNERS)
    w.sim.teams.update({"octo-org/dba": {"carol", "mallory"}, "octo-org/platform": {"carol", "dave"}})
    return w


@pytest.mark.terraform
def test_owners_approved_blocks_a_comment_apply_until_a_member_of_each_group_approves_the_head(
        world_factory):  # noqa: F811
    w = owned_world(world_factory, "apply_on_comment: true\napply_requirements: [owners_approved]\n")
    w.sim.permissions["dave"] = "read"
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    body = marked(w, 1)
    assert "| write | `terraform_data.db` | `@octo-org/dba` |" in body, body
    assert "| write | `terraform_data.db_backup` | `@octo-org/platform` |" in body, body
    assert "**Owner approval missing** (of the head, by a member with write access): `@octo-org/dba`, " \
           "`@octo-org/platform`" in body, body

    # bob may write but belongs to neither team; mallory is in dba but may only read; dave likewise.
    w.sim.review(1, "bob", "APPROVED")
    w.sim.review(1, "mallory", "APPROVED")
    w.sim.review(1, "dave", "APPROVED")
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    reply = replies(w, 1)[-1]
    assert "- **owners_approved**: no approval of the head" in reply, reply
    assert "`@octo-org/platform` (for `terraform_data.db_backup`, `terraform_data.db_backup.*`)" in reply, reply
    assert "`@octo-org/dba` (for `terraform_data.db`, `terraform_data.db.*`)" in reply, reply

    # carol is in both teams, but approved the commit before the latest push: stale.
    w.sim.review(1, "carol", "APPROVED")
    w.push_pr(1, {"db.tf": DB_V2 + "\n"})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert "**owners_approved**: no approval of the head" in replies(w, 1)[-1]
    assert w.serial() == 1 and w.runs() == [] and reservations(w) == []

    w.sim.review(1, "carol", "APPROVED")
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2", replies(w, 1)[-1]
    assert w.serial() == 2


@pytest.mark.terraform
def test_a_merge_its_owners_did_not_approve_is_reported_and_not_applied(world_factory):  # noqa: F811
    w = owned_world(world_factory, "apply_requirements: [owners_approved]\n")
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    w.sim.review(1, "bob", "APPROVED")  # a writer, but in no owning team
    w.merge(1)
    w.run_jobs()

    assert w.serial() == 1 and w.runs() == [] and reservations(w) == []
    body = marked(w, 1)
    assert "**Apply failed**" in body and "owners_approved: no approval of the head" in body, body
    assert "@octo-org/dba or" not in body and "@octo-org/dba (for terraform_data.db, terraform_data.db.*)" in body
    [check] = [r for r in w.sim.runs("kilolock/apply") if r["head_sha"] == w.head("main")]
    assert check["conclusion"] == "failure"


@pytest.mark.terraform
def test_a_merge_apply_its_owners_approved_reads_the_pull_request_once(world_factory):  # noqa: F811
    w = owned_world(world_factory, "apply_requirements: [owners_approved]\n")
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    w.sim.review(1, "carol", "APPROVED")  # a writer in both owning teams
    w.merge(1)
    w.run_jobs(max_jobs=1)  # the merge: it enqueues the project's apply
    before = len(w.sim.calls)
    w.run_jobs(max_jobs=1)  # the apply, gated by the owners of the base's .kilolock.yml
    pulls = [c.path for c in w.sim.calls[before:] if c.method == "GET" and c.path == f"/repos/{REPO}/pulls/1"]

    assert w.serial() == 2 and reservations(w) == []
    assert pulls == [f"/repos/{REPO}/pulls/1"], [(c.method, c.path) for c in w.sim.calls[before:]]
