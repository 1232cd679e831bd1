"""What the page tests measure in Chromium: a window of a given width (a phone, whose layout
follows the page's viewport tag, or a desktop window), whether a page fits it, and logging in
through the dashboard's form."""

from __future__ import annotations

import json
from typing import Any

from tests.browser.cdp import Page

PHONE = 390
DESKTOP = 1280
WIDTHS = (PHONE, DESKTOP)

# Elements (other than the contents of a box that scrolls on its own) sticking out of the page.
STICKING_OUT = """[...document.querySelectorAll('body *')]
  .filter(el => !el.closest('.scroll, .table-scroll'))
  .filter(el => el.getClientRects().length)
  .filter(el => el.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
  .map(el => el.tagName + (el.id ? '#' + el.id : '') + (el.className ? '.' + el.className : ''))"""


def window(page: Page, pixels: int) -> None:
    """A window `pixels` wide: at phone width a mobile one (its layout width is what the page's
    viewport tag says: 980 px without one), else a desktop one."""
    page.send(
        "Emulation.setDeviceMetricsOverride",
        width=pixels,
        height=900,
        deviceScaleFactor=1,
        mobile=pixels <= PHONE,
    )


def layout(page: Page) -> dict[str, Any]:
    found: dict[str, Any] = page.evaluate(
        "({scroll: document.scrollingElement.scrollWidth, inner: window.innerWidth,"
        " client: document.documentElement.clientWidth})"
    )
    return found


def assert_fits(page: Page, pixels: int, what: str) -> None:
    """The page is laid out at `pixels` and never scrolls sideways; nothing sticks out of it."""
    found = layout(page)
    assert found["inner"] == pixels, (what, found)
    assert found["scroll"] <= found["inner"], (what, found)
    stuck = page.evaluate(STICKING_OUT)
    assert stuck == [], (what, stuck)


def visible_within(page: Page, selector: str) -> list[dict[str, Any]]:
    """Each element matching `selector` that is not fully inside the window or inside the box
    that holds it (a cell a table's scroll box cuts off, say): its text and box."""
    found: list[dict[str, Any]] = page.evaluate(
        f"""[...document.querySelectorAll({json.dumps(selector)})].map(el => {{
              const r = el.getBoundingClientRect();
              const holder = el.closest('.scroll, .table-scroll') || document.documentElement;
              const box = holder.getBoundingClientRect();
              const right = Math.min(box.right, document.documentElement.clientWidth);
              return {{text: el.textContent.trim(), left: r.left, right: r.right, limit: right}};
            }}).filter(c => c.left < -1 || c.right > c.limit + 1)"""
    )
    return found


def click_and_wait(page: Page, selector: str) -> None:
    """Click an element that navigates (a link, a submit button) and wait for the new page."""
    page.events.clear()
    page.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
    page.wait_for("Page.loadEventFired")


def log_in(page: Page, base_url: str, token: str) -> None:
    page.navigate(f"{base_url}/dashboard/login")
    page.evaluate(f"document.getElementById('token').value = {json.dumps(token)}")
    click_and_wait(page, "#login-form button[type=submit]")
    assert page.evaluate("location.pathname") == "/dashboard"


def text_of(page: Page, selector: str) -> Any:
    return page.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? null")
