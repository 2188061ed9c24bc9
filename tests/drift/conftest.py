"""Fixtures for the tests that need real remote objects: the fakecloud provider, built once per session
into a filesystem mirror, and a checkout applied through a live server."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fakecloud.install import Installed, install
from tests.fakecloud.world import CloudRepo, make_repo


@pytest.fixture(scope="session")
def fakecloud(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return install(tmp_path_factory.mktemp("fakecloud-provider"))


@pytest.fixture
def cloud_repo(live_server, tmp_path: Path, terraform_factory, fakecloud: Installed) -> CloudRepo:  # type: ignore[no-untyped-def]
    return make_repo(tmp_path, live_server.state_url("cloud"), fakecloud, dict(terraform_factory("home").env))
