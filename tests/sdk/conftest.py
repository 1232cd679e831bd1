"""tests/sdk fixtures: one real app per module (DuckDB file, lifespan run), a fresh world per test.

`world` and `live_server` override the suite's fixtures of those names: each test still gets its
own account, workspace, program, key and partner (`world`, `live_world`), so nothing another test
recorded or flagged is visible to it; only the app's (and the server process's) start-up is shared
by a module, which keeps the SDK tests fast."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import load_settings
from tests.conftest import OPERATOR_TOKEN, WEBHOOK_SECRET, LiveServer, World, make_world, start_server


@pytest.fixture(scope="module")
def sdk_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = load_settings(
        database=str(tmp_path_factory.mktemp("sdk") / "tally.duckdb"),
        operator_token=OPERATOR_TOKEN,
        base_url="http://testserver",
        stripe_webhook_secrets=WEBHOOK_SECRET,
        reconcile_interval_seconds=0,
    )
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def world(sdk_app: TestClient) -> World:
    return make_world(sdk_app)


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("sdk_live") / "live.duckdb")
    try:
        yield server
    finally:
        server.stop()
