"""The browser tests' Chromium: one headless browser per test module, a fresh page per test.
A module that needs other browser flags (host mappings, a window size) defines its own
`chromium` fixture with `launch(...)`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.browser.cdp import CHROMIUM, Chromium, Page


@contextmanager
def launch(*flags: str) -> Iterator[Chromium]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install chromium)")
    with Chromium(*flags) as browser:
        yield browser


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    with launch() as browser:
        yield browser


@pytest.fixture
def page(chromium: Chromium) -> Iterator[Page]:
    page = chromium.new_page()
    page.send("Network.clearBrowserCookies")
    yield page
    page.close()
