"""The dashboard's paper cuts, through the real app (the browser tests measure the same pages in
Chromium at 390 and 1280 px: tests/browser/test_pages.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import logged_in, program_path


# -- an empty month is not a green "Reconciled" ---------------------------------------------------
def test_an_empty_month_says_there_is_nothing_to_reconcile_not_reconciled(world: World) -> None:
    logged_in(world.client, world.account_token)
    before_any_run = world.client.get(program_path(world, "/finance?period=2026-01")).text
    assert 'id="no-activity"' in before_any_run and 'id="no-run-yet"' in before_any_run
    assert 'id="reconciled"' not in before_any_run and "checks pass" not in before_any_run

    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    empty = world.client.get(program_path(world, "/finance?period=2026-01")).text
    assert 'id="no-activity"' in empty and "nothing to" in empty
    assert 'id="no-run-yet"' not in empty
    assert 'id="reconciled"' not in empty and "0 checks pass" not in empty
    html = world.client.get(
        f"/api/v1/programs/{world.program_id}/reports/finance?period=2026-01&format=html",
        headers=world.owner,
    ).text
    assert 'id="no-activity"' in html and 'id="reconciled"' not in html


def test_a_month_before_the_program_existed_says_so(client: TestClient) -> None:
    with time_machine.travel(datetime(2026, 3, 10, 12, 0, tzinfo=UTC), tick=True):
        world = make_world(client)
        logged_in(client, world.account_token)
        page = client.get(program_path(world, "/finance?period=2025-11")).text
        assert 'id="before-program"' in page and "before this program existed" in page
        assert "period=2026-03" in page  # a link to its first month
        page = client.get(program_path(world, "/finance?period=2026-03")).text
        assert 'id="before-program"' not in page


def test_a_month_with_sales_is_still_reconciled_in_green(world: World) -> None:
    assert world.sale(occurred_at="2026-01-05T10:00:00Z").status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world, "/finance?period=2026-01")).text
    assert 'id="reconciled"' in page and 'id="no-activity"' not in page
