"""Fixtures for the tests that need real remote objects: a checkout applied through a live server, with the
fakecloud provider (the session fixture ``fakecloud`` in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fakecloud.install import Installed
from tests.fakecloud.world import CloudRepo, make_repo


@pytest.fixture
def cloud_repo(live_server, tmp_path: Path, terraform_factory, fakecloud: Installed) -> CloudRepo:  # type: ignore[no-untyped-def]
    return make_repo(tmp_path, live_server.state_url("cloud"), fakecloud, dict(terraform_factory("home").env))
