"""scope_changes: diff entries → the files, deletions and widenings of a file-scoped plan, without git."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from analyzer.gitdiff import FULL, ChangeScope, DeletedFile, DiffEntry, Widening, WidenKind, scope_changes

OLD_TEXT = 'resource "terraform_data" "gone" {}\n'


def scope(*entries: DiffEntry, config_dir: str = "", texts: Mapping[str, str] | None = None,
          modules: Mapping[str, str] | None = None,
          readers: Mapping[str, tuple[str, ...]] | None = None) -> ChangeScope:
    return scope_changes(entries, config_dir=config_dir, texts_at_ref=texts or {}, module_sources=modules or {},
                         file_readers=readers or {})


def effects(result: ChangeScope) -> list[tuple[str, str]]:
    return [(w.path, w.effect) for w in result.widen]


# --- .tf files in the configuration directory ---------------------------------------------------------


@pytest.mark.parametrize("change", ["added", "modified", "copied"])
def test_an_added_modified_or_copied_tf_file_is_a_file_to_plan(change):
    result = scope(DiffEntry(change, "main.tf", "other.tf" if change == "copied" else None))
    assert result.files == ("main.tf",)
    assert (result.deleted, result.widen, result.failures, result.unrelated) == ((), (), (), ())


def test_a_tf_json_file_is_a_file_to_plan_like_a_tf_file():
    assert scope(DiffEntry("modified", "generated.tf.json", None)).files == ("generated.tf.json",)


def test_a_deleted_tf_file_is_kept_with_its_text_at_ref():
    result = scope(DiffEntry("deleted", "db.tf", None), texts={"db.tf": OLD_TEXT})
    assert result.deleted == (DeletedFile("db.tf", OLD_TEXT),)
    assert result.files == ()


def test_a_deleted_tf_file_without_its_text_is_a_failure_not_a_silent_omission():
    result = scope(DiffEntry("deleted", "db.tf", None))
    assert result.deleted == ()
    assert len(result.failures) == 1 and result.failures[0].startswith("db.tf: ")
    assert "planned for destruction" in result.failures[0] and "kl plan without -f" in result.failures[0]


def test_a_pure_rename_plans_the_new_file_and_deletes_nothing():
    result = scope(DiffEntry("renamed", "database.tf", "db.tf", 100), texts={"db.tf": OLD_TEXT})
    assert result.files == ("database.tf",)
    assert result.deleted == ()


@pytest.mark.parametrize("similarity", [87, None])
def test_a_rename_with_edits_also_keeps_the_old_text_so_removed_blocks_are_not_forgotten(similarity):
    result = scope(DiffEntry("renamed", "database.tf", "db.tf", similarity), texts={"db.tf": OLD_TEXT})
    assert result.files == ("database.tf",)
    assert result.deleted == (DeletedFile("db.tf", OLD_TEXT),)


def test_a_rename_out_of_the_configuration_directory_is_a_deletion():
    result = scope(DiffEntry("renamed", "attic/db.tf", "infra/db.tf", 100), config_dir="infra",
                   texts={"infra/db.tf": OLD_TEXT})
    assert result.deleted == (DeletedFile("db.tf", OLD_TEXT),)
    assert result.files == ()
    assert result.unrelated == ("attic/db.tf",)


def test_a_rename_into_the_configuration_directory_is_an_addition():
    result = scope(DiffEntry("renamed", "infra/db.tf", "attic/db.tf", 100), config_dir="infra")
    assert result.files == ("db.tf",)
    assert result.unrelated == ("attic/db.tf",)


def test_a_tf_file_moved_into_a_module_deletes_it_here_and_widens_to_the_module():
    result = scope(DiffEntry("renamed", "modules/web/db.tf", "db.tf", 100), texts={"db.tf": OLD_TEXT},
                   modules={"web": "./modules/web"})
    assert result.deleted == (DeletedFile("db.tf", OLD_TEXT),)
    assert effects(result) == [("modules/web/db.tf", "module:web")]


@pytest.mark.parametrize("name", ["override.tf", "web_override.tf", "override.tf.json"])
def test_an_override_file_needs_a_full_plan(name):
    result = scope(DiffEntry("modified", name, None))
    assert result.files == ()
    assert effects(result) == [(name, FULL)]
    assert "override" in result.widen[0].reason


# --- variables and the lock file ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["terraform.tfvars", "prod.auto.tfvars", "terraform.tfvars.json",
                                  "x.auto.tfvars.json"])
def test_an_auto_loaded_variables_file_widens_to_the_variables_it_changes(name):
    result = scope(DiffEntry("modified", f"infra/{name}", None), config_dir="infra")
    assert effects(result) == [(f"infra/{name}", f"variables:{name}")]
    assert result.widen[0].kind is WidenKind.VARIABLES and result.widen[0].names == (name,)
    assert not result.needs_full_plan


def test_a_variables_file_only_var_file_reads_needs_a_full_plan():
    result = scope(DiffEntry("modified", "infra/prod.tfvars", None), config_dir="infra")
    assert effects(result) == [("infra/prod.tfvars", FULL)] and result.needs_full_plan
    assert "-var-file" in result.widen[0].reason
    assert "kl plan -C infra without -f" in result.widen[0].reason


def test_the_dependency_lock_file_needs_a_full_plan():
    result = scope(DiffEntry("modified", ".terraform.lock.hcl", None))
    assert effects(result) == [(".terraform.lock.hcl", FULL)]
    assert "provider versions" in result.widen[0].reason


# --- local modules ----------------------------------------------------------------------------------------


def test_a_file_in_a_local_module_widens_to_the_whole_module_call():
    result = scope(DiffEntry("modified", "modules/web/main.tf", None), modules={"web": "modules/web"})
    assert result.widen == (Widening("modules/web/main.tf",
                                     "inside modules/web, the source of module 'web': plans module.web.*",
                                     WidenKind.MODULE, ("web",)),)
    assert result.files == () and not result.needs_full_plan


def test_every_call_of_a_changed_module_directory_is_widened():
    result = scope(DiffEntry("added", "modules/web/vars.tf", None), modules={"blue": "modules/web",
                                                                           "green": "modules/web"})
    assert effects(result) == [("modules/web/vars.tf", "module:blue"), ("modules/web/vars.tf", "module:green")]


def test_a_module_directory_does_not_cover_a_sibling_sharing_its_prefix():
    result = scope(DiffEntry("modified", "modules/webapp/main.tf", None), modules={"web": "modules/web"})
    assert effects(result) == [("modules/webapp/main.tf", FULL)]


def test_a_module_outside_the_configuration_directory_is_still_followed():
    result = scope(DiffEntry("modified", "modules/web/main.tf", None), DiffEntry("modified", "modules/db/x.tf", None),
                   config_dir="envs/prod", modules={"web": "../../modules/web"})
    assert effects(result) == [("modules/web/main.tf", "module:web")]
    assert result.unrelated == ("modules/db/x.tf",)


def test_a_deleted_module_file_widens_to_the_module_and_needs_no_text():
    result = scope(DiffEntry("deleted", "modules/web/old.tf", None), modules={"web": "modules/web"})
    assert effects(result) == [("modules/web/old.tf", "module:web")]
    assert result.failures == ()


# --- files read by file() and templatefile() ------------------------------------------------------------


def test_a_template_read_by_file_adds_its_readers_to_the_files():
    result = scope(DiffEntry("modified", "infra/templates/user_data.sh", None),
                   DiffEntry("modified", "infra/main.tf", None), config_dir="infra",
                   readers={"templates/user_data.sh": ("web.tf", "bastion.tf")})
    assert result.files == ("bastion.tf", "main.tf", "web.tf")
    assert effects(result) == [("infra/templates/user_data.sh", "files:bastion.tf,web.tf")]
    assert not result.needs_full_plan


def test_a_template_read_inside_a_module_widens_to_that_module():
    result = scope(DiffEntry("modified", "shared/policy.json", None), modules={"web": "modules/web"},
                   readers={"shared/policy.json": ("modules/web/iam.tf",)})
    assert effects(result) == [("shared/policy.json", "module:web")]


def test_a_template_read_by_a_file_we_cannot_place_needs_a_full_plan():
    result = scope(DiffEntry("modified", "policy.json", None), readers={"policy.json": ("nested/x.tf",)})
    assert effects(result) == [("policy.json", FULL)]


def test_a_reader_deleted_in_the_same_change_is_analysed_from_its_old_text_not_passed_as_a_file():
    result = scope(DiffEntry("modified", "policy.json", None), DiffEntry("deleted", "iam.tf", None),
                   texts={"iam.tf": OLD_TEXT}, readers={"policy.json": ("iam.tf",)})
    assert result.files == ()
    assert result.deleted == (DeletedFile("iam.tf", OLD_TEXT),)


@pytest.mark.parametrize("path", ["README.md", "scripts/bootstrap.sh", "examples/main.tf", "env/prod.tfvars"])
def test_any_other_file_in_the_configuration_directory_needs_a_full_plan(path):
    result = scope(DiffEntry("modified", path, None))
    assert effects(result) == [(path, FULL)]
    assert "could not see" in result.widen[0].reason


# --- what is ignored ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [".terraform/modules/modules.json", "modules/web/.terraform/x", "terraform.tfstate",
                                  "terraform.tfstate.backup", ".terraform.tfstate.lock.info", ".#main.tf",
                                  "main.tf~", "#main.tf#"])
def test_terraform_working_files_and_files_terraform_skips_are_unrelated(path):
    result = scope(DiffEntry("modified", path, None), modules={"web": "modules/web"})
    assert result.unrelated == (path,)
    assert (result.files, result.widen, result.failures) == ((), (), ())


def test_paths_outside_the_configuration_directory_are_unrelated():
    result = scope(DiffEntry("modified", "README.md", None), DiffEntry("added", "docs/x.md", None),
                   DiffEntry("modified", "infra/production/main.tf", None),
                   DiffEntry("modified", "infra/prod/main.tf", None), config_dir="infra/prod")
    assert result.files == ("main.tf",)
    assert result.unrelated == ("README.md", "docs/x.md", "infra/production/main.tf")


# --- failures -------------------------------------------------------------------------------------------------


def test_a_type_change_in_the_configuration_is_a_failure():
    result = scope(DiffEntry("type_changed", "infra/main.tf", None),
                   DiffEntry("type_changed", "other/link", None), config_dir="infra")
    assert len(result.failures) == 1
    assert result.failures[0].startswith("infra/main.tf: its type changed")
    assert result.unrelated == ("other/link",)
    assert result.has_failures


def test_unmerged_and_unknown_changes_are_failures():
    result = scope(DiffEntry("unmerged", "main.tf", None), DiffEntry("exploded", "x.tf", None))
    assert result.failures == ("main.tf: has unresolved merge conflicts; resolve them and try again",
                               "x.tf: unknown kind of change 'exploded'; run a full plan instead: kl plan "
                               "without -f")


# --- shape ------------------------------------------------------------------------------------------------------


def test_files_are_config_relative_sorted_and_unique():
    result = scope(DiffEntry("modified", "infra/b.tf", None), DiffEntry("added", "infra/a.tf", None),
                   DiffEntry("modified", "infra/templates/t.tpl", None), config_dir="./infra/",
                   readers={"templates/t.tpl": ("b.tf",)})
    assert result.config_dir == "infra"
    assert result.files == ("a.tf", "b.tf")


def test_nothing_changed_is_an_empty_scope():
    assert scope() == ChangeScope("", (), (), (), (), ())


@pytest.mark.parametrize("config_dir", ["../elsewhere", "/abs/infra", ".."])
def test_a_config_dir_outside_the_repository_is_rejected(config_dir):
    with pytest.raises(ValueError, match="inside"):
        scope(config_dir=config_dir)


# --- Kilolock's own artifacts ----------------------------------------------------------------------------


def test_a_plan_file_the_caller_recognised_is_unrelated_wherever_it_lies_in_the_configuration():
    entries = (DiffEntry("added", "infra/kl-plan.igplan"), DiffEntry("modified", "infra/out/p.json"),
               DiffEntry("added", "infra/notes.json"), DiffEntry("modified", "infra/main.tf"))
    result = scope_changes(entries, config_dir="infra", texts_at_ref={},
                           artifacts=frozenset({"infra/kl-plan.igplan", "infra/out/p.json"}))
    assert result.files == ("main.tf",) and result.unrelated == ("infra/kl-plan.igplan", "infra/out/p.json")
    assert effects(result) == [("infra/notes.json", FULL)]  # not recognised: it still fails closed


@pytest.mark.parametrize("name", ["main.tf", "x.tf.json", "terraform.tfvars", "a.auto.tfvars.json", "prod.tfvars",
                                  ".terraform.lock.hcl"])
def test_a_name_terraform_loads_is_configuration_even_when_called_an_artifact(name):
    result = scope_changes((DiffEntry("added", name),), config_dir="", texts_at_ref={}, artifacts=frozenset({name}))
    assert name not in result.unrelated


def test_an_artifact_inside_a_module_or_read_by_file_counts_like_any_file():
    entries = (DiffEntry("added", "modules/web/p.json"), DiffEntry("added", "read.json"))
    result = scope_changes(entries, config_dir="", texts_at_ref={}, module_sources={"web": "modules/web"},
                           file_readers={"read.json": ("main.tf",)},
                           artifacts=frozenset({"modules/web/p.json", "read.json"}))
    assert result.unrelated == () and result.files == ("main.tf",)
    assert effects(result) == [("modules/web/p.json", "module:web"), ("read.json", "files:main.tf")]
