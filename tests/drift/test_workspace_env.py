"""Private workspaces run Terraform with the user's own CLI configuration: its file made absolute, its plugin
cache (environment or CLI configuration) kept, no shared TF_DATA_DIR, and the lock file carried."""

from __future__ import annotations

from pathlib import Path

from runner.core import session, workspace


def test_a_relative_cli_config_is_made_absolute_and_tf_data_dir_is_dropped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.tfrc").write_text("")
    env = session.terraform_env({"TF_CLI_CONFIG_FILE": "my.tfrc", "TF_DATA_DIR": "/shared",
                                   "TF_HTTP_PASSWORD": "x"}, tmp_path / "cache")
    assert env["TF_CLI_CONFIG_FILE"] == str(tmp_path / "my.tfrc")
    assert "TF_DATA_DIR" not in env and "TF_HTTP_PASSWORD" not in env
    assert env["TF_PLUGIN_CACHE_DIR"] == str(tmp_path / "cache")


def test_the_users_plugin_cache_wins_from_the_environment_or_the_cli_configuration(tmp_path):
    assert session.plugin_cache({"TF_PLUGIN_CACHE_DIR": str(tmp_path / "mine")}, tmp_path / "kl") == tmp_path / "mine"
    rc = tmp_path / "terraformrc"
    rc.write_text('plugin_cache_dir = "$HOME/.terraform.d/plugin-cache"\n')
    found = session.plugin_cache({"TF_CLI_CONFIG_FILE": str(rc), "HOME": str(tmp_path)}, tmp_path / "kl")
    assert found == tmp_path / ".terraform.d" / "plugin-cache"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".terraformrc").write_text('plugin_cache_dir = "/opt/tf-cache"\n')
    assert session.plugin_cache({"HOME": str(home)}, tmp_path / "kl") == Path("/opt/tf-cache")
    assert session.plugin_cache({"HOME": str(tmp_path / "nobody")}, tmp_path / "kl") == tmp_path / "kl"


def test_the_lock_file_is_copied_into_full_workspaces_and_carried_by_minimal_ones(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "main.tf").write_text('resource "terraform_data" "a" {}\n')
    (config / workspace.LOCK_FILE).write_text("# pins\n")
    ws = workspace.build(config, tmp_path / "ws", None)
    assert (ws.path / workspace.LOCK_FILE).read_text() == "# pins\n"
    dest = tmp_path / "minimal"
    dest.mkdir()
    workspace.carry_lock_file(config, dest)
    assert (dest / workspace.LOCK_FILE).is_file()
