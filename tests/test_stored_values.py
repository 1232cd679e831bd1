"""Values stored before today's bounds (or rows the hot path must not learn from) never stop
start-up, a reconcile, or a later sale: a database poisoned by an older release keeps working."""

from __future__ import annotations

import duckdb
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from ingest.domain.bounds import LATEST
from tests.conftest import OP, make_world
from tests.helpers import deliver, renewal_event

ACCOUNT = "acct_stored_values"


@pytest.mark.embedded
def test_settings_and_deadlines_poisoned_by_an_older_release_are_read_within_bounds(
    settings: Settings,
) -> None:
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        assert world.sale().status_code == 200
    # what the old release let an owner and the operator save
    with duckdb.connect(settings.database) as con:
        con.execute(
            "UPDATE programs SET settings = json_merge_patch(settings, ?) WHERE program_id = ?",
            ['{"commission_type": "flat", "commission_flat": 9223372036854775808,'
             ' "recurring_months": 9223372036854775807, "holding_days": -5}', world.program_id],
        )  # fmt: skip
        con.execute("SET TimeZone = 'UTC'")
        con.execute(
            "UPDATE credentials SET flagged_at = now(), rotation_deadline = '10000-01-01 00:59:59+00'"
            " WHERE kind = 'program' AND revoked_at IS NULL"
        )
    with TestClient(create_app(settings)) as client:
        world.client = client
        r = client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner)
        assert r.status_code == 200, r.text
        stored = r.json()["data"]
        assert (stored["commission_flat"], stored["recurring_months"], stored["holding_days"]) == (
            10**12,
            1200,
            0,
        )
        r = client.post("/api/v1/operator/reconcile", headers=OP)
        assert r.status_code == 200, r.text
        r = world.sale(transaction_id="in_2")
        assert r.status_code == 200, r.text
        assert r.json()["warnings"][0]["deadline"] == LATEST.strftime("%Y-%m-%dT%H:%M:%SZ")
        r = client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner)
        assert r.status_code == 200, r.text


def test_an_unusable_delivery_claims_nothing_now_or_after_a_restart(settings: Settings) -> None:
    def deliver_paid_in_year_10000(client: TestClient, invoice_id: str) -> int:
        paid_in_year_10000 = {"paid_at": 253402300800}
        event = renewal_event("evt_unusable_time", invoice_id, ACCOUNT, status_transitions=paid_in_year_10000)
        return deliver(client, event).status_code

    with TestClient(create_app(settings)) as client:
        world = make_world(client, stripe_account_id=ACCOUNT)
        assert deliver_paid_in_year_10000(client, "in_now") == 422
        assert world.sale(transaction_id="in_now").status_code == 200  # the invoice id was not taken
        assert deliver_paid_in_year_10000(client, "in_later") == 422
    with TestClient(create_app(settings)) as client:  # nor does the log replayed at start take it
        world.client = client
        assert world.sale(transaction_id="in_later").status_code == 200
        assert world.sale(transaction_id="in_now").status_code == 409


def test_a_key_flagged_for_rotation_keeps_its_headers_after_a_restart(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        r = client.post(
            f"/api/v1/operator/programs/{world.program_id}/api-key/rotation",
            json={"deadline": "2099-06-15T12:00:00+02:00"},
            headers=OP,
        )
        assert r.status_code == 200, r.text
    with TestClient(create_app(settings)) as client:  # the deadline now comes from the database
        world.client = client
        r = world.sale()
        assert r.status_code == 200, r.text
        assert r.headers["Sunset"] == "Mon, 15 Jun 2099 10:00:00 GMT"
        assert r.json()["warnings"][0]["deadline"] == "2099-06-15T10:00:00Z"
