"""Settings are read once from KL_* variables and fail closed, listing every problem."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import pytest

from app.config import DEFAULT_MAX_BODY_BYTES, TABLE, AuthMode, Settings
from app.envtable import Setting, bind, comma_list, read_table, whole
from app.errors import ConfigError
from runner.core.config import TABLE as CLIENT_TABLE
from runner.core.config import ClientSettings, data_dir, default_actor


def test_defaults_are_open_mode_embedded_database_and_256_mib_bodies():
    settings = Settings.from_env({})
    assert settings.auth_mode is AuthMode.OPEN
    assert settings.database_url is None
    assert settings.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 256 * 1024 * 1024


def test_every_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"KL_AUTH_MODE": "static", "KL_MAX_BODY_BYTES": "lots", "KL_AUTO_MIGRATE": "maybe"})
    problems = caught.value.problems
    assert any("KL_AUTH_TOKEN" in p for p in problems)
    assert any("KL_MAX_BODY_BYTES" in p for p in problems)
    assert any("KL_AUTO_MIGRATE" in p for p in problems)


def test_unknown_auth_modes_are_refused():
    with pytest.raises(ConfigError, match="KL_AUTH_MODE"):
        Settings.from_env({"KL_AUTH_MODE": "none"})


def test_values_are_read_from_the_environment():
    settings = Settings.from_env({
        "KL_DATABASE_URL": "postgresql://x/y", "KL_REDIS_URL": "redis://r", "KL_DATA_DIR": "/tmp/kl",
        "KL_AUTH_MODE": "static", "KL_AUTH_TOKEN": "t", "KL_TERRAFORM_BIN": "/bin/tf",
        "KL_MAX_BODY_BYTES": "1024",
    })
    assert settings.database_url == "postgresql://x/y" and settings.redis_url == "redis://r"
    assert settings.data_dir == Path("/tmp/kl") and settings.auth_token == "t"
    assert settings.max_body_bytes == 1024
    # The Terraform binary is a client setting: kl and the workers' Terraform runs read it, the service does not.
    assert ClientSettings.from_env({"KL_TERRAFORM_BIN": "/bin/tf"}).terraform_bin == "/bin/tf"


def test_the_token_never_appears_in_repr():
    assert "hunter2" not in repr(Settings.from_env({"KL_AUTH_MODE": "static", "KL_AUTH_TOKEN": "hunter2"}))


@pytest.mark.parametrize("table, settings", [(TABLE, Settings), (CLIENT_TABLE, ClientSettings)])
def test_each_table_fills_every_field_once_with_the_field_s_own_default(table, settings):
    defaults = {f.name: f.default for f in fields(settings)}
    assert [row.field for row in table] == list(defaults)
    assert all(defaults[row.field] is not MISSING and row.default == defaults[row.field] for row in table)
    assert len({row.variable for row in table}) == len(table)


def test_blank_values_mean_the_default_and_each_bad_value_is_one_problem():
    assert Settings.from_env({"KL_DB_POOL_SIZE": "  ", "KL_LOG_LEVEL": "warn"}).db_pool_size == 10
    assert Settings.from_env({"KL_LOG_LEVEL": "warn"}).log_level == "WARNING"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"KL_GITHUB_CLONE_URLS": "a/b=u, nope, c=d", "KL_JOB_TIMEOUT": "5"})
    assert caught.value.problems == (
        "KL_GITHUB_CLONE_URLS entries are owner/repo=URL; got 'nope'",
        "KL_GITHUB_CLONE_URLS entries are owner/repo=URL; got 'c=d'",
        "KL_JOB_TIMEOUT must be at least 10, got 5",
    )


def test_the_data_directory_is_resolved_the_same_way_for_the_service_and_kl():
    assert data_dir({"KL_DATA_DIR": "~/kl"}) == Settings.from_env({"KL_DATA_DIR": "~/kl"}).data_root
    assert data_dir({}) == Settings().data_root and Settings().data_root.name == "kilolock"
    assert default_actor({"KL_ACTOR": "ci@build"}) == "ci@build"


def test_a_private_key_that_is_no_pem_and_no_file_is_one_problem(tmp_path):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"KL_GITHUB_APP_ID": "1", "KL_GITHUB_PRIVATE_KEY": str(tmp_path / "missing.pem")})
    assert len(caught.value.problems) == 1 and "neither PEM text nor a readable file" in caught.value.problems[0]
    (tmp_path / "key.pem").write_text("-----BEGIN RSA PRIVATE KEY-----\n")
    read = Settings.from_env({"KL_GITHUB_APP_ID": "1", "KL_GITHUB_PRIVATE_KEY": str(tmp_path / "key.pem")})
    assert read.github_private_key == "-----BEGIN RSA PRIVATE KEY-----\n"


def test_a_table_is_bound_to_its_dataclass_field_by_field_and_takes_each_default_from_the_field():
    @dataclass(frozen=True)
    class Two:
        a: int = 3
        b: tuple[str, ...] = ()

    rows = (Setting("a", "KL_A", whole(), "a"), Setting("b", "KL_B", comma_list, "b"))
    assert [row.default for row in bind(Two, rows)] == [3, ()]
    assert read_table(bind(Two, rows), {"KL_B": "x, y"})[0] == {"a": 3, "b": ("x", "y")}
    with pytest.raises(RuntimeError, match="not its fields"):
        bind(Two, rows[::-1])
    with pytest.raises(RuntimeError, match="not its fields"):
        bind(Two, rows[:1])
    with pytest.raises(RuntimeError, match="no default"):
        rows[0].read({}, [])

    @dataclass(frozen=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    with pytest.raises(RuntimeError, match="plain default"):
        bind(Factory, (Setting("a", "KL_A", whole(), "a"),))


def test_the_backend_block_is_found_the_same_in_texts_already_read(tmp_path: Path):
    from runner.core.config import backend_texts, read_tf_files, resolve
    from runner.core.filescoped import read_configuration

    (tmp_path / "main.tf").write_text('resource "terraform_data" "a" {}\n')
    (tmp_path / "backend.tf").write_bytes(b'# caf\xe9\nterraform {\n  backend "http" {\n'
                                          b'    address = "http://h:1/v1/states/s"\n    username = "u"\n  }\n}\n')
    (tmp_path / "kilolock_override.tf").write_text('terraform {\n  backend "local" {}\n}\n')
    (tmp_path / "extra.tf.json").write_text("{}")
    texts = read_configuration(tmp_path)
    # Only the texts that name "backend" are handed on: the others cannot hold the block.
    assert backend_texts(tmp_path, texts) == {n: t for n, t in read_tf_files(tmp_path).items() if "backend" in t}
    assert set(backend_texts(tmp_path, texts)) == {"backend.tf", "kilolock_override.tf"}
    assert resolve(config_dir=tmp_path, env={}, texts=texts) == resolve(config_dir=tmp_path, env={})
    assert resolve(config_dir=tmp_path, env={}, texts=texts).state == "s"


def test_the_backend_block_is_found_among_many_files_that_do_not_name_it(tmp_path: Path):
    from runner.core.config import backend_texts, resolve
    from runner.core.filescoped import read_configuration

    for i in range(30):
        (tmp_path / f"f{i}.tf").write_text(f'resource "terraform_data" "r{i}" {{\n  input = "x"\n}}\n')
    # "backend" in a value of a file before the block's file: looked at, holds no block, the search goes on.
    (tmp_path / "a_mentions.tf").write_text('locals {\n  note = "the backend is http"\n}\n')
    (tmp_path / "zz_backend.tf").write_text('terraform {\n  backend "http" {\n'
                                            '    address = "http://h:1/v1/states/late"\n    username = "u"\n  }\n}\n')
    texts = read_configuration(tmp_path)
    assert set(backend_texts(tmp_path, texts)) == {"a_mentions.tf", "zz_backend.tf"}
    assert resolve(config_dir=tmp_path, env={}, texts=texts).state == "late"
    assert resolve(config_dir=tmp_path, env={}).state == "late"


def test_configuration_files_read_as_bytes_give_the_texts_a_text_read_gives(tmp_path: Path) -> None:
    from runner.core.config import read_tf

    contents = {"crlf.tf": b'resource "a" "b" {\r\n  x = "1"\r\n}\r\n', "cr.tf": b'locals {\r  y = 2\r}\r\n\r',
                "latin1.tf": b'# caf\xe9\nvariable "v" {}\n', "bom.tf": b'\xef\xbb\xbfoutput "o" { value = 1 }\n',
                "utf8.tf": 'locals { z = "\u00e9\u2603" }\n'.encode(), "empty.tf": b"", "j.tf.json": b'{"a":\r\n1}',
                "notes.txt": b"not read"}
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    texts = read_tf(tmp_path)
    assert texts == {name: (tmp_path / name).read_text(encoding="utf-8", errors="surrogateescape")
                     for name in contents if name.endswith((".tf", ".tf.json"))}
    assert texts["crlf.tf"].count("\n") == 3 and "\r" not in texts["cr.tf"]


def test_a_configuration_file_larger_than_one_read_is_read_whole(tmp_path: Path) -> None:
    from runner.core.config import read_tf

    # Past the size one os.read takes, with a CRLF pair and a multi-byte character across the 64 KiB boundary.
    body = b"#" * ((1 << 16) - 2) + b"\r\n\xc3\xa9" + b'locals { a = "x" }\r\n' * 20000
    (tmp_path / "big.tf").write_bytes(body)
    (tmp_path / "empty.tf").write_bytes(b"")
    texts = read_tf(tmp_path)
    assert texts["big.tf"] == (tmp_path / "big.tf").read_text(encoding="utf-8", errors="surrogateescape")
    assert len(texts["big.tf"].encode()) == len(body) - 20001 and texts["empty.tf"] == ""
