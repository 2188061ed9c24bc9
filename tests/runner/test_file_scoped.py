"""kl plan -f / kl apply X.igplan / --changed-from end to end, with real Terraform and real git.
After every change the trunk must be what a full apply would have produced: vanilla Terraform over the
whole configuration plans no changes."""

from __future__ import annotations

import json

import pytest
import requests

from tests.conftest import TRUNK_FILES, Workdir, held_until, wait_for

pytestmark = pytest.mark.terraform

FILES = {
    **TRUNK_FILES,
    "db.tf": 'resource "terraform_data" "db" {\n  input = "${local.prefix}-db-v1"\n}\n\n'
             'resource "terraform_data" "db_backup" {\n  input = "backup"\n}\n\n'
             'output "db" {\n  value = terraform_data.db.output\n}\n',
    "app.tf": 'module "app" {\n  source = "./modules/app"\n  name   = "app-v1"\n}\n',
    "modules/app/main.tf": 'variable "name" {\n  type = string\n}\n\n'
                           'resource "terraform_data" "svc" {\n  input = var.name\n}\n',
    # Planning the whole configuration fails on this file; a file-scoped plan never loads it.
    "trap.tf": 'resource "terraform_data" "trap" {\n  input = "ok"\n}\n',
}


@pytest.fixture
def repo(live_server, workdir_factory):  # type: ignore[no-untyped-def]
    return make_repo(live_server, workdir_factory)


def make_repo(live_server, workdir_factory) -> Workdir:  # type: ignore[no-untyped-def]
    """A git repository holding FILES, applied to the state ``files``, whose trap.tf no full plan survives."""
    r = workdir_factory("repo", live_server.state_url("files"))
    r.seed(FILES)
    r.write(".gitignore", ".terraform/\n*.igplan\nkl-plan.json\n.terraform.lock.hcl\n")
    r.git("init", "-q")
    r.git("add", "-A")
    r.git("commit", "-qm", "trunk")
    # From now on a full plan breaks on trap.tf: file-scoped plans must not read it.
    r.write("trap.tf", 'resource "terraform_data" "trap" {\n  input = file("missing.txt")\n}\n')
    r.git("commit", "-qam", "a file no full plan survives")
    return r


def spec(repo: Workdir, name: str = ".kilolock/kl-plan.igplan") -> dict:  # type: ignore[type-arg]
    return json.loads((repo.dir / name).read_text())


def plan_apply(repo: Workdir, *plan_args: str, actor: str = "alice") -> dict:  # type: ignore[type-arg]
    planned = repo.kl("plan", *plan_args)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    applied = repo.kl("apply", ".kilolock/kl-plan.igplan", "--actor", actor)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "committed at serial" in applied.stdout or "nothing changed" in applied.stdout
    return spec(repo)


def untrap(repo: Workdir) -> None:
    repo.write("trap.tf", FILES["trap.tf"])


def test_an_attribute_edit_plans_only_its_file_and_converges(repo):
    repo.edit("db.tf", "db-v1", "db-v2")
    planned = plan_apply(repo, "-f", "db.tf")
    assert planned["mode"] == "files" and planned["selected_files"] == ["db.tf"]
    assert planned["write_set"] == ["terraform_data.db"]
    assert set(planned["files"]) <= {"db.tf", "variables.tf", "backend.tf"}, planned["files"]
    assert all("web" not in g and "trap" not in g for g in planned["slice_globs"])
    untrap(repo)
    repo.converged()


def test_added_and_count_changed_resources_converge(repo):
    repo.write("db.tf", FILES["db.tf"] + '\nresource "terraform_data" "cache" {\n  input = "new"\n}\n')
    repo.edit("web.tf", "count = 2", "count = 3")
    planned = plan_apply(repo, "-f", "db.tf", "-f", "web.tf")
    assert set(planned["write_set"]) == {"terraform_data.cache", "terraform_data.web[2]"}
    untrap(repo)
    repo.converged()


def test_a_module_input_change_converges(repo):
    repo.edit("app.tf", "app-v1", "app-v2")
    planned = plan_apply(repo, "-f", "app.tf")
    assert planned["write_set"] == ["module.app.terraform_data.svc"] and "module.app.*" in planned["write_globs"]
    untrap(repo)
    repo.converged()


def test_a_rename_with_a_moved_block_moves_instead_of_recreating(repo):
    before = {r["name"]: r["instances"][0]["attributes"]["id"]
              for r in requests.get(repo.url, timeout=10).json()["resources"]}
    repo.write("db.tf", FILES["db.tf"].replace('"db_backup"', '"backup"')
               + '\nmoved {\n  from = terraform_data.db_backup\n  to   = terraform_data.backup\n}\n')
    planned = plan_apply(repo, "-f", "db.tf")
    assert planned["actions"] == {"terraform_data.backup": "move"}
    after = {r["name"]: r["instances"][0]["attributes"]["id"]
             for r in requests.get(repo.url, timeout=10).json()["resources"]}
    assert after["backup"] == before["db_backup"] and "db_backup" not in after
    untrap(repo)
    repo.converged()


def test_editing_a_file_others_depend_on_widens_to_their_files(repo):
    repo.edit("network.tf", "net-v1", "net-v2")
    planned = plan_apply(repo, "-f", "network.tf")
    assert any(w.startswith("web.tf:1: consumer: terraform_data.web refers to terraform_data.net")
               for w in planned["warnings"]), planned["warnings"]
    assert set(planned["write_set"]) == {"terraform_data.net", "terraform_data.web[0]", "terraform_data.web[1]"}
    untrap(repo)
    repo.converged()


def test_changed_from_covers_edits_new_files_deleted_blocks_and_deleted_files(repo):
    repo.edit("db.tf", 'resource "terraform_data" "db_backup" {\n  input = "backup"\n}\n\n', "")
    repo.write("queue.tf", 'resource "terraform_data" "queue" {\n  input = "q"\n}\n')
    (repo.dir / "app.tf").unlink()
    planned = plan_apply(repo, "--changed-from", "HEAD")
    assert set(planned["write_set"]) == {"terraform_data.db_backup", "terraform_data.queue",
                                         "module.app.terraform_data.svc"}
    assert planned["actions"]["terraform_data.db_backup"] == "delete"
    assert planned["actions"]["module.app.terraform_data.svc"] == "delete"
    untrap(repo)
    repo.converged()


def test_changed_from_follows_renames(repo):
    repo.git("mv", "db.tf", "database.tf")
    repo.edit("database.tf", "db-v1", "db-v3")
    planned = plan_apply(repo, "--changed-from", "HEAD")
    assert planned["selected_files"] == ["database.tf"] and planned["write_set"] == ["terraform_data.db"]
    untrap(repo)
    repo.converged()


def test_a_tfvars_change_plans_the_consumers_of_the_changed_variables(repo):
    repo.write("prod.auto.tfvars", 'env = "staging"\n')
    planned = plan_apply(repo, "--changed-from", "HEAD")
    assert planned["seed_variables"] == ["var.env"]
    assert {"terraform_data.net", "terraform_data.db", "terraform_data.web[0]"} <= set(planned["write_set"])
    assert "terraform_data.db_backup" not in planned["write_set"]
    untrap(repo)
    repo.converged()


def test_an_unreadable_tfvars_change_fails_closed(repo):
    repo.write("prod.auto.tfvars", 'env = = "staging"\n')
    refused = repo.kl("plan", "--changed-from", "HEAD")
    assert refused.returncode == 3 and "prod.auto.tfvars" in refused.stderr
    assert "kl plan without -f" in refused.stderr


@pytest.mark.parametrize("name, text, construct", [
    ("broken.tf", 'resource "terraform_data" "b" {\n  input = \n}\n', "parse_error"),
    ("undefined.tf", 'resource "terraform_data" "u" {\n  input = terraform_data.nowhere.output\n}\n',
     "undefined_reference"),
    ("json.tf.json", '{"resource": {"terraform_data": {"j": {"input": "x"}}}}', "tf_json"),
])
def test_unsafe_constructs_fail_closed_with_file_line_and_fallback(repo, name, text, construct):
    repo.write(name, text)
    before = requests.get(repo.url, timeout=10).content
    refused = repo.kl("plan", "-f", name)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert f"{name}:" in refused.stderr and construct in refused.stderr
    assert "kl plan without -f" in refused.stderr
    assert requests.get(repo.url, timeout=10).content == before


def test_apply_f_needs_confirm_scope_and_dry_run_prints_the_rerun_command(repo):
    repo.edit("db.tf", "db-v1", "db-v4")
    refused = repo.kl("apply", "-f", "db.tf")
    assert refused.returncode == 3 and "--confirm-scope" in refused.stderr
    assert "write terraform_data.db" in refused.stdout
    dry = repo.kl("apply", "-f", "db.tf", "--dry-run")
    assert dry.returncode == 0 and "kl apply -f db.tf --confirm-scope" in dry.stdout
    done = repo.kl("apply", "-f", "db.tf", "--confirm-scope", "--actor", "alice")
    assert done.returncode == 0 and "committed at serial" in done.stdout, done.stdout + done.stderr
    untrap(repo)
    repo.converged()


def test_an_igplan_refuses_files_edited_after_planning(repo):
    repo.edit("db.tf", "db-v1", "db-v5")
    assert repo.kl("plan", "-f", "db.tf").returncode == 0
    repo.edit("db.tf", "db-v5", "db-v6")
    refused = repo.kl("apply", ".kilolock/kl-plan.igplan")
    assert refused.returncode == 2 and "db.tf changed since kl plan -f" in refused.stderr


def test_disjoint_file_scoped_applies_run_together_and_overlapping_ones_conflict(repo, tmp_path):
    gate = tmp_path / "release-applies"
    for name in ("a", "b"):
        repo.write(f"slow_{name}.tf", f'resource "terraform_data" "{name}" {{\n  input = "{name}1"\n'
                   f'  provisioner "local-exec" {{\n    command = "{held_until(gate)}"\n  }}\n}}\n')
    assert repo.kl("plan", "-f", "slow_a.tf", "--out", "a.igplan").returncode == 0
    assert repo.kl("plan", "-f", "slow_b.tf", "--out", "b.igplan").returncode == 0
    assert repo.kl("plan", "-f", "slow_a.tf", "--out", "a2.igplan").returncode == 0
    runs_url = repo.url.replace("/v1/states/files", "/v1/engine/runs?state=files")
    procs = [repo.kl_popen("apply", plan, "--actor", actor)
             for plan, actor in (("a.igplan", "alice"), ("b.igplan", "bob"))]
    try:
        wait_for(lambda: {r["actor"] for r in requests.get(runs_url, timeout=10).json()["runs"]
                          if r["status"] == "running"} == {"alice", "bob"}, "both applies to run")
        conflict = repo.kl("apply", "a2.igplan", "--actor", "carol")
    finally:
        gate.touch()
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert conflict.returncode == 2 and "held by alice" in conflict.stderr, conflict.stdout + conflict.stderr
    runs = requests.get(runs_url, timeout=10).json()["runs"]
    done = {r["actor"]: r for r in runs if r["status"] == "committed"}
    assert done["alice"]["started_at"] < done["bob"]["finished_at"]
    assert done["bob"]["started_at"] < done["alice"]["finished_at"]
    untrap(repo)
    repo.converged()


def test_a_block_reading_files_carries_the_configurations_other_files(repo):
    repo.write("greeting.txt", "hello\n")
    repo.write("greet.tf", 'resource "terraform_data" "greet" {\n  input = file("${path.module}/greeting.txt")\n}\n')
    planned = plan_apply(repo, "-f", "greet.tf")
    assert "greeting.txt" in planned["files"]
    assert any("file_function" in w for w in planned["warnings"])
    untrap(repo)
    repo.converged()


# --- the configuration graph, variable values, outputs, modules --------------------------------------------


def test_a_locals_file_change_plans_the_for_each_consumers_in_other_files(repo):
    repo.write("sizes.tf", 'locals {\n  sizes = { a = "s", b = "m" }\n}\n')
    repo.write("fleet.tf", 'resource "terraform_data" "node" {\n  for_each = local.sizes\n  input = each.value\n}\n')
    plan_apply(repo, "-f", "fleet.tf")
    repo.write("sizes.tf", 'locals {\n  sizes = { b = "l", c = "s" }\n}\n')
    planned = plan_apply(repo, "-f", "sizes.tf")
    assert set(planned["write_set"]) == {'terraform_data.node["a"]', 'terraform_data.node["b"]',
                                         'terraform_data.node["c"]'}
    untrap(repo)
    repo.converged()


def test_selecting_only_the_variables_file_plans_every_consumer(repo):
    repo.edit("variables.tf", 'default = "prod"', 'default = "qa"')
    planned = plan_apply(repo, "-f", "variables.tf")
    assert {"terraform_data.net", "terraform_data.db", "terraform_data.web[1]"} <= set(planned["write_set"])
    assert "db" in planned["output_changes"]
    untrap(repo)
    repo.converged()


def test_tfvars_values_are_used_and_pinned(repo):
    repo.write("replicas.tf", 'variable "replicas" {\n  type    = number\n  default = 1\n}\n')
    repo.write("terraform.tfvars", "replicas = 3\n")
    repo.write("fleet.tf", 'resource "terraform_data" "r" {\n  count = var.replicas\n  input = count.index\n}\n')
    planned = plan_apply(repo, "-f", "fleet.tf")
    assert len(planned["write_set"]) == 3, planned["write_set"]
    assert any(v["kind"] == "auto-var-file" and v["name"].endswith("terraform.tfvars") for v in planned["variables"])
    repo.edit("fleet.tf", "input = count.index", 'input = "x${count.index}"')
    assert repo.kl("plan", "-f", "fleet.tf").returncode == 0
    repo.write("terraform.tfvars", "replicas = 1\n")
    refused = repo.kl("apply", ".kilolock/kl-plan.igplan")
    assert refused.returncode == 2 and "terraform.tfvars changed" in refused.stderr, refused.stderr
    repo.write("terraform.tfvars", "replicas = 3\n")
    repo.write("late.auto.tfvars", "replicas = 1\n")
    refused = repo.kl("apply", ".kilolock/kl-plan.igplan")
    assert refused.returncode == 2 and "late.auto.tfvars appeared" in refused.stderr, refused.stderr
    (repo.dir / "late.auto.tfvars").unlink()
    assert repo.kl("apply", ".kilolock/kl-plan.igplan").returncode == 0
    untrap(repo)
    repo.converged()


def test_root_outputs_reading_what_the_change_writes_are_committed(repo):
    repo.write("outputs.tf", 'output "net" {\n  value = terraform_data.net.output\n}\n')
    plan_apply(repo, "-f", "network.tf")
    repo.edit("network.tf", "net-v1", "net-v9")
    planned = plan_apply(repo, "-f", "network.tf")
    assert "net" in planned["output_changes"] and "output.net" in planned["write_globs"]
    outputs = requests.get(repo.url, timeout=10).json()["outputs"]
    assert outputs["net"]["value"] == "prod-app-net-v9" and "db" in outputs
    untrap(repo)
    repo.converged()


def test_a_tf_json_consumer_fails_closed(repo):
    repo.write("peers.tf.json", json.dumps({"resource": {"terraform_data": {"peer": {
        "input": "${terraform_data.net.output}"}}}}))
    repo.edit("network.tf", "net-v1", "net-v2")
    refused = repo.kl("plan", "-f", "network.tf")
    assert refused.returncode == 3 and "peers.tf.json:1: tf_json" in refused.stderr, refused.stderr


@pytest.mark.parametrize("label", ['resource "terraform_data" "1web"', 'module "super#module"', 'module ""',
                                   'data "x" "my state"'])
def test_a_label_terraform_rejects_is_a_diagnostic_not_a_traceback(repo, label):
    repo.write("bad.tf", label + ' {\n  source = "./x"\n}\n')
    refused = repo.kl("plan", "-f", "db.tf")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "bad.tf:1: invalid_label" in refused.stderr and "fix `bad.tf:1`" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_syntax_error_names_the_file_and_line_to_fix(repo):
    repo.write("broken.tf", 'resource "terraform_data" "b" {\n  input = "x"\n  oops = = 1\n}\n')
    refused = repo.kl("plan", "-f", "broken.tf")
    assert refused.returncode == 3 and "fix `broken.tf:3`" in refused.stderr, refused.stderr


def test_sibling_and_parent_relative_modules_resolve_inside_the_workspace(repo):
    (repo.dir.parent / "cache").mkdir()
    (repo.dir.parent / "cache" / "main.tf").write_text(
        'variable "n" {}\nmodule "inner" {\n  source = "../shared"\n  n = var.n\n}\n')
    (repo.dir.parent / "shared").mkdir()
    (repo.dir.parent / "shared" / "main.tf").write_text('variable "n" {}\nresource "terraform_data" "s" {\n'
                                                       '  input = var.n\n}\n')
    # a stale file where the old builder used to copy a "../" source: never planned
    repo.write("cache.tf", 'module "cache" {\n  source = "../cache"\n  n = "v1"\n}\n')
    # The boundary is the repository holding the configuration: here one holding it and both modules.
    import shutil

    shutil.rmtree(repo.dir / ".git")
    repo.run("git", "init", "-q", str(repo.dir.parent))
    planned = plan_apply(repo, "-f", "cache.tf")
    assert planned["write_set"] == ["module.cache.module.inner.terraform_data.s"]
    assert any(k.startswith("../shared/") for k in planned["files"])
    untrap(repo)
    repo.tf("init", "-input=false")
    repo.converged()


def test_a_module_outside_the_repository_is_refused(repo):
    repo.write("far.tf", 'module "far" {\n  source = "../../../../../../../../.."\n}\n')
    refused = repo.kl("plan", "-f", "far.tf")
    assert refused.returncode == 3 and "outside" in refused.stderr and "Traceback" not in refused.stderr


def test_a_data_source_of_the_selection_is_written_re_read_and_committed(repo, tmp_path):
    other = tmp_path / "other.tfstate"
    other.write_text(json.dumps({"version": 4, "terraform_version": "1.11.0", "serial": 1, "lineage": "x",
                                 "outputs": {"v": {"value": "one", "type": "string"}}, "resources": []}))
    repo.write("remote.tf", 'data "terraform_remote_state" "o" {\n  backend = "local"\n'
               f'  config = {{ path = "{other}" }}\n}}\n\n'
               'resource "terraform_data" "uses" {\n  input = data.terraform_remote_state.o.outputs.v\n}\n')
    planned = plan_apply(repo, "-f", "remote.tf")
    assert {"data.terraform_remote_state.o", "data.terraform_remote_state.o.*"} <= set(planned["write_globs"])
    repo.edit("remote.tf", "uses", "uses2")
    assert repo.kl("plan", "-f", "remote.tf").returncode == 0
    # What the data source reads changes between the plan and the apply: the apply commits what it read.
    other.write_text(other.read_text().replace('"one"', '"two"').replace('"serial": 1', '"serial": 2'))
    applied = repo.kl("apply", ".kilolock/kl-plan.igplan", "--actor", "alice")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    rows = {r["name"]: r["instances"][0]["attributes"] for r in requests.get(repo.url, timeout=10).json()["resources"]
            if r["name"] in ("o", "uses2")}
    assert rows["o"]["outputs"]["value"] == {"v": "two"} and rows["uses2"]["input"]["value"] == "two", rows


def test_changed_from_selects_the_literal_file_readers_of_a_changed_file(repo):
    repo.write("greeting.txt", "hello\n")
    repo.write("greet.tf", 'resource "terraform_data" "greet" {\n  input = file("${path.module}/greeting.txt")\n}\n')
    plan_apply(repo, "-f", "greet.tf")
    repo.git("add", "-A")
    repo.git("commit", "-qm", "greeting")
    repo.write("greeting.txt", "hello again\n")
    planned = plan_apply(repo, "--changed-from", "HEAD")
    assert planned["selected_files"] == ["greet.tf"] and planned["write_set"] == ["terraform_data.greet"]
    untrap(repo)
    repo.converged()


def test_a_plan_that_would_change_an_unselected_file_names_the_file_that_declares_it(repo):
    # web.tf reads terraform_data.net, so its workspace holds network.tf's block as it is on disk: edited
    # but not selected, Terraform plans its update, and kl refuses it, naming the file to add to -f.
    repo.edit("network.tf", "net-v1", "net-v2")
    refused = repo.kl("plan", "-f", "web.tf")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "outside the file-scoped footprint (terraform_data.net (declared in network.tf))" in refused.stderr
    assert "add the file that declares it to -f" in refused.stderr
