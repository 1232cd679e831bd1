"""Bugs the Schemathesis run (tests/api/test_schemathesis.py) found, each pinned by a plain test."""

from __future__ import annotations

from tests.conftest import OP, World
from tests.helpers import logged_in, program_path


def test_a_sales_page_number_past_the_database_integers_is_a_422_not_a_500(world: World) -> None:
    """`page` became an OFFSET of (page - 1) * 50: from about 1.8e17 on it overflowed DuckDB's
    BIGINT once sales were reconciled, and the dashboard answered 500."""
    assert world.sale().status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    logged_in(world.client, world.account_token)
    for page in (2**62, 10**9 + 1):
        r = world.client.get(program_path(world, f"/sales?page={page}"))
        assert r.status_code == 422, (page, r.status_code)
        assert "validation_error" in r.text
    r = world.client.get(program_path(world, "/sales?page=1000000000"))
    assert r.status_code == 200
