"""`GET /docs` in real headless Chromium against a live server: Swagger UI renders every operation
of /openapi.json from the app's own assets, under the page's Content-Security-Policy, with no
request to any address but the app (Chromium is also told that no other host exists)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.browser.cdp import CHROMIUM, Chromium, Page
from tests.conftest import LiveServer

CSP_PROBE = """window.__cspListening = true; window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"""


@pytest.fixture
def page() -> Iterator[Page]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install chromium)")
    # Every host name but the loopback address fails to resolve: a CDN could not answer anyway.
    with Chromium("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1") as browser:
        page = browser.new_page()
        page.send("Page.addScriptToEvaluateOnNewDocument", source=CSP_PROBE)
        yield page
        page.close()


def requested_urls(page: Page) -> list[str]:
    """Every URL the page fetched (the browser's resource timing entries, data: URIs aside), and
    those Chromium reported since the page loaded."""
    urls: list[str] = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    urls += [
        e["params"]["request"]["url"] for e in page.events if e.get("method") == "Network.requestWillBeSent"
    ]
    return urls


@pytest.mark.browser
def test_docs_page_renders_every_operation_offline(
    live_server: LiveServer, page: Page, tmp_path: Path
) -> None:
    doc = httpx.get(f"{live_server.url}/openapi.json", timeout=30).json()
    expected = sorted(
        f"{method.upper()} {path}"
        for path, item in doc["paths"].items()
        for method in item
        if method != "parameters"
    )
    page.navigate(f"{live_server.url}/docs")
    shown = page.wait_until(
        f"""(() => {{ const ops = [...document.querySelectorAll('.opblock-summary')].map(s =>
              s.querySelector('.opblock-summary-method').textContent + ' ' +
              s.querySelector('.opblock-summary-path').getAttribute('data-path'));
            return ops.length >= {len(expected)} ? ops : null; }})()"""
    )
    assert sorted(shown) == expected
    assert page.evaluate("document.querySelector('.info .title').textContent").startswith("tally")
    # the error envelope is among the shared schemas shown
    titles = page.evaluate(
        "[...document.querySelectorAll('section.models .json-schema-2020-12__title')].map(t => t.textContent)"
    )
    assert {"Error", "SaleIn", "Program"} <= set(titles)
    assert page.evaluate("window.__cspListening") is True
    assert page.evaluate("window.__csp") == []
    urls = requested_urls(page)
    assert f"{live_server.url}/openapi.json" in urls
    assert f"{live_server.url}/docs/assets/swagger-ui-bundle.js" in urls
    outside = [u for u in urls if not u.startswith(live_server.url + "/") and not u.startswith("data:")]
    assert outside == []
    page.screenshot(tmp_path / "docs.png")
