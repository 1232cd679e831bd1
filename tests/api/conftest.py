"""Fixtures of the outbound webhook tests (tests/api/test_webhooks_*.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings


@pytest.fixture
def hooks_settings(settings: Settings) -> Settings:
    """Loopback endpoints allowed; no delivery worker, so a test sends what is due itself."""
    return settings.model_copy(update={"webhooks_allow_private": True, "webhooks_delivery": False})


@pytest.fixture
def app_client(hooks_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(hooks_settings)) as c:
        yield c
