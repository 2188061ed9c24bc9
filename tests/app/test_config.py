"""Settings are read once from KL_* variables and fail closed, listing every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import DEFAULT_MAX_BODY_BYTES, AuthMode, Settings
from app.errors import ConfigError


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
    assert settings.terraform_bin == "/bin/tf" and settings.max_body_bytes == 1024


def test_the_token_never_appears_in_repr():
    assert "hunter2" not in repr(Settings.from_env({"KL_AUTH_MODE": "static", "KL_AUTH_TOKEN": "hunter2"}))
