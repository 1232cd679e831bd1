"""`/docs/errors`: every error and warning code says when it is raised and how to fix it, on a
page that fits a phone (its viewport tag; tests/browser/test_pages.py measures it in Chromium)."""

from __future__ import annotations

import re
from collections import Counter
from html.parser import HTMLParser

from starlette.testclient import TestClient

from api.errorfixes import ERROR_FIXES, WARNING_FIXES
from api.routes.docs import WARNING_CODES
from ingest.domain.errors import ALL_ERRORS


class Sections(HTMLParser):
    """Each `<section id=...>`'s text, and every id on the page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.text: dict[str, str] = {}
        self.fixes: dict[str, str] = {}
        self._section: str | None = None
        self._in_fix = False
        self.viewport: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(str(found["id"]))
        if tag == "meta" and found.get("name") == "viewport":
            self.viewport = found.get("content")
        if tag == "section" and found.get("id"):
            self._section = str(found["id"])
            self.text[self._section] = ""
            self.fixes[self._section] = ""
        if tag == "p" and found.get("class") == "fix":
            self._in_fix = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        if tag == "p":
            self._in_fix = False

    def handle_data(self, data: str) -> None:
        if self._section is not None:
            self.text[self._section] += data
            if self._in_fix:
                self.fixes[self._section] += data


def plain(fix: str) -> str:
    """A fix as the page's text shows it (its `backticked` parts are <code> there)."""
    return " ".join(fix.replace("`", "").split())


def test_every_code_has_a_how_to_fix_entry() -> None:
    codes = {cls.code for cls in ALL_ERRORS}
    assert codes - set(ERROR_FIXES) == set()
    assert set(ERROR_FIXES) - codes == set()  # no entry for a code that no longer exists
    assert set(WARNING_FIXES) == set(WARNING_CODES)


def test_the_page_says_when_and_how_to_fix_for_every_code(client: TestClient) -> None:
    r = client.get("/docs/errors")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = Sections()
    page.feed(r.text)
    assert page.viewport == "width=device-width, initial-scale=1"
    assert [i for i, n in Counter(page.ids).items() if n > 1] == []  # every anchor lands once
    shown = [cls for cls in ALL_ERRORS if cls.code != "internal_error"]
    for cls in shown:
        text = " ".join(page.text[cls.code].split())
        assert f"HTTP {cls.status}" in text, cls.code
        assert text.count("When:") == 1 and "How to fix:" in text, cls.code
        fix = " ".join(page.fixes[cls.code].split()).removeprefix("How to fix: ")
        assert fix == plain(ERROR_FIXES[cls.code]), cls.code
    for code in WARNING_CODES:
        anchor = f"warning-{code}" if code in {c.code for c in ALL_ERRORS} else code
        fix = " ".join(page.fixes[anchor].split()).removeprefix("How to fix: ")
        assert fix == plain(WARNING_FIXES[code]), code
    # the contract's doc_url anchors (`#<code>`) land on the error, not on a warning of that name
    assert re.search(
        r'<section id="sale_not_found" class="code">\s*<h2><code>sale_not_found</code> '
        r'<span class="status">HTTP 404',
        r.text,
    )
    assert "<code>TALLY_STRIPE_WEBHOOK_SECRETS</code>" in r.text  # backticks are code
