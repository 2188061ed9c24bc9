"""The pins stage: a plan pins its configuration by its mode (the whole configuration's hash, or each file a
file-scoped workspace was cut from) and every variable input; verify is the one check of them before an
apply. Pure: files on disk, no server, no Terraform."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from runner.core import pins
from runner.core.errors import InvalidInput, StalePlan
from runner.core.spec import PinKind, PlanMode, PlanSpec


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def spec_of(config_dir: Path, **fields: object) -> PlanSpec:
    base = PlanSpec(state="prod", address="http://kl", lineage="L1", base_serial=1, terraform_version="1.15.5",
                    config_dir=str(config_dir), config_hash=pins.config_hash(config_dir), created_at="now",
                    write_set=(), read_set=(), write_globs=(), read_globs=(), actions={}, described_resources=(),
                    orphans=(), warnings=())
    return replace(base, **fields)  # type: ignore[arg-type]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    infra = tmp_path / "infra"
    infra.mkdir()
    (infra / "db.tf").write_text('resource "terraform_data" "db" {}\n')
    (infra / "net.tf").write_text('resource "terraform_data" "net" {}\n')
    return infra


def test_a_full_plan_pins_the_whole_configuration(config: Path) -> None:
    spec = spec_of(config)
    pins.verify(spec, config, {}, {})
    (config / "net.tf").write_text('resource "terraform_data" "net2" {}\n')
    with pytest.raises(StalePlan, match=r"the configuration in .* changed since kl plan: re-run kl plan$"):
        pins.verify(spec, config, {}, {})


def test_a_file_scoped_plan_pins_its_files_and_not_the_others(config: Path) -> None:
    files = pins.pin_files(config, ["db.tf"], ())
    assert files == {"db.tf": sha('resource "terraform_data" "db" {}\n')}
    spec = spec_of(config, mode=PlanMode.FILES, config_hash="", files=files)
    (config / "net.tf").write_text('resource "terraform_data" "net2" {}\n')
    pins.verify(spec, config, {}, {})  # another file moved: not this plan's input
    (config / "terraform.tfvars").write_text('x = "1"\n')
    with pytest.raises(StalePlan, match=r"^terraform.tfvars appeared since kl plan -f"):
        pins.verify(spec, config, {}, {})
    (config / "terraform.tfvars").unlink()
    (config / "db.tf").write_text('resource "terraform_data" "db2" {}\n')
    with pytest.raises(StalePlan, match=r"^db.tf changed since kl plan -f: re-run kl plan -f$"):
        pins.verify(spec, config, {}, {})


def test_pinned_files_cover_the_lock_file_and_local_modules(config: Path) -> None:
    (config / ".terraform.lock.hcl").write_text("# lock\n")
    module = config.parent / "modules" / "app"
    (module / ".terraform").mkdir(parents=True)
    (module / "main.tf").write_text("# module\n")
    (module / ".terraform" / "junk").write_text("x")
    pinned = pins.pin_files(config, ["db.tf"], [module])
    assert set(pinned) == {"db.tf", ".terraform.lock.hcl", "../modules/app/main.tf"}


def test_every_variable_kind_is_pinned_and_verified(config: Path) -> None:
    (config.parent / "extra.tfvars").write_text('y = "2"\n')
    (config / "terraform.tfvars").write_text('x = "1"\n')
    env = {"TF_VAR_z": "3", "HOME": "/h"}
    given = [("var", "name=web"), ("var", "secret=s3"), ("var-file", str(config.parent / "extra.tfvars"))]
    variables = pins.pin_variables(given, env, frozenset({"secret"}), config)
    assert [(v.kind, v.value) for v in variables] == [
        (PinKind.AUTO_VAR_FILE, None), (PinKind.VAR, "web"), (PinKind.VAR, None), (PinKind.VAR_FILE, None),
        (PinKind.ENV, None)]
    spec = spec_of(config, variables=variables)
    supplied = {"secret": "s3"}
    pins.verify(spec, config, env, supplied)
    with pytest.raises(InvalidInput, match="variable secret is sensitive and not stored in the plan file"):
        pins.verify(spec, config, env, {})
    with pytest.raises(StalePlan, match="^variable secret differs from what kl plan used"):
        pins.verify(spec, config, env, {"secret": "other"})
    with pytest.raises(StalePlan, match="^TF_VAR_z differs from what kl plan saw"):
        pins.verify(spec, config, {"TF_VAR_z": "4"}, supplied)
    with pytest.raises(StalePlan, match="^TF_VAR_new is set but was not when kl plan ran"):
        pins.verify(spec, config, {**env, "TF_VAR_new": "1"}, supplied)
    (config.parent / "extra.tfvars").write_text('y = "3"\n')
    with pytest.raises(StalePlan, match="changed or vanished since kl plan"):
        pins.verify(spec, config, env, supplied)


def test_a_missing_var_file_is_refused_when_pinned(config: Path) -> None:
    with pytest.raises(InvalidInput, match="^-var-file nowhere.tfvars: no such file$"):
        pins.pin_variables([("var-file", "nowhere.tfvars")], {}, frozenset(), config)



def test_a_re_plan_must_write_what_the_plan_file_says_data_sources_aside(config: Path) -> None:
    spec = spec_of(config, write_set=("terraform_data.db", "data.http.x"))
    pins.verify_replan(spec, {"terraform_data.db", "data.http.y"})
    with pytest.raises(StalePlan) as stale:
        pins.verify_replan(spec, {"terraform_data.net"})
    assert str(stale.value) == ("the re-plan over the trunk slice differs from kl-plan.json (new: "
                                "['terraform_data.net'], gone: ['terraform_data.db']); nothing was applied: "
                                "re-run kl plan")
