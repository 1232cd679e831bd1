"""The real app with a random log, for the reconcile properties that go through it (backfill,
what a replica publishes): shared by test_backfill_properties and test_published (no test
module imports another)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
from polars.testing import assert_frame_equal
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings, load_settings
from api.state import State
from ingest.storage.contract import Reader
from reconcile.run import job
from reconcile.run.engine import open_engine
from reconcile.schema import EXPLAIN_SCHEMA, UNROUTABLE_SCHEMA
from tests.conftest import OP, OPERATOR_TOKEN, WEBHOOK_SECRET, bearer
from tests.reconcile.compare import checked
from tests.reconcile.database import ORDERS, assert_materialised, materialised
from tests.reconcile.streams import Stream

Tables = dict[str, pl.DataFrame]
SCHEMAS = {**job.TABLES, "rc_unroutable": ("unroutable", UNROUTABLE_SCHEMA)}


def stream_rows(
    stream: Stream, ids: dict[str, str], rows: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """`rows` (default: the stream's) with each stream program id replaced by the real one."""
    return [
        {
            **row,
            "program_id": ids.get(row["program_id"]),
            "meta_program_id": ids.get(row["meta_program_id"], row["meta_program_id"]),
        }
        for row in (stream.rows if rows is None else rows)
    ]


def replica_settings(database: str, engine_dir: str, partitions: int = 1) -> Settings:
    """The app's settings here: `database`, the working copy in `engine_dir`, no schedule, the
    programs reconciled in `partitions` partitions."""
    return load_settings(
        database=database,
        engine_dir=engine_dir,
        operator_token=OPERATOR_TOKEN,
        base_url="http://testserver",
        stripe_webhook_secrets=WEBHOOK_SECRET,
        reconcile_interval_seconds=0,
        reconcile_partitions=partitions,
    )


@contextmanager
def replica(database: str, partitions: int = 1) -> Iterator[State]:
    """Another replica of the PostgreSQL `database` (the real app), its working copies empty."""
    with (
        tempfile.TemporaryDirectory() as folder,
        TestClient(create_app(replica_settings(database, folder, partitions))) as client,
    ):
        yield client.app.state.tally  # type: ignore[attr-defined]


@contextmanager
def app_with(
    stream: Stream, database: str | None = None, rows: list[dict[str, Any]] | None = None, partitions: int = 1
) -> Iterator[tuple[TestClient, State, dict[str, str]]]:
    """The real app on a fresh database (a DuckDB file, or `database`, a PostgreSQL URL): the
    programs (their settings) and partners of `stream` created through the API, its log (or
    `rows` of it) appended through the app's own writer with each stream program id replaced by
    the real one; on PostgreSQL reconciled in `partitions` partitions. (client, state, stream id ->
    real id)."""
    with tempfile.TemporaryDirectory() as folder:
        settings = replica_settings(
            database or str(Path(folder) / "tally.duckdb"), str(Path(folder) / "engine"), partitions
        )
        with TestClient(create_app(settings)) as client:
            r = client.post(
                "/api/v1/operator/accounts", json={"email": "o@brand.test", "workspace_name": "B"}, headers=OP
            )
            assert r.status_code == 201, r.text
            workspace, owner = r.json()["data"]["workspace_id"], bearer(r.json()["data"]["token"])
            ids: dict[str, str] = {}
            for program in stream.programs.to_dicts():
                body = {k: v for k, v in program.items() if k != "program_id"}
                # per-currency settings travel in the frame as JSON text (reconcile/terms.py)
                body["commission_flat"] = json.loads(body["commission_flat"])
                r = client.post(
                    "/api/v1/programs", json={**body, "workspace_id": workspace, "name": "P"}, headers=owner
                )
                assert r.status_code == 201, r.text
                ids[program["program_id"]] = r.json()["data"]["program_id"]
            for partner in stream.partners.to_dicts():
                payload = {"code": partner["code"], "name": partner["code"], "email": partner["email"]}
                path = f"/api/v1/programs/{ids[partner['program_id']]}/partners"
                r = client.post(path, json={k: v for k, v in payload.items() if v is not None}, headers=owner)
                assert r.status_code == 201, r.text
            rows = stream_rows(stream, ids, rows)
            state: State = client.app.state.tally  # type: ignore[attr-defined]
            state.writer.run_sync(lambda tx: [tx.append(row) for row in rows], flush=True)
            yield client, state, ids


def tables(state: State) -> Tables:
    """Every materialised table and the explain view of the reconciler's engine, sorted."""
    with open_engine(state.store) as engine:
        return engine_tables(engine.cursor)


def engine_tables(cur: duckdb.DuckDBPyConnection) -> Tables:
    """Every materialised table and the explain view of the engine on `cur`, sorted."""
    out = {
        name: materialised(cur, name, schema).sort(ORDERS[attribute], nulls_last=True)
        for name, (attribute, schema) in SCHEMAS.items()
    }
    explain: pl.DataFrame = cur.sql("SELECT * FROM rc_explain").pl()
    out["rc_explain"] = explain.sort("program_id", "sale_id", "step")
    return out


def published(db: Reader) -> Tables:
    """The same, as readers see them (on PostgreSQL: the tables a replica published)."""
    out = {}
    for name, (attribute, schema) in {**SCHEMAS, "rc_explain": ("explain", EXPLAIN_SCHEMA)}.items():
        frame = db.frame(f"SELECT {', '.join(schema)} FROM {name}")
        frame = frame.select(pl.col(column).cast(dtype) for column, dtype in schema.items())
        order = ["program_id", "sale_id", "step"] if name == "rc_explain" else ORDERS[attribute]
        out[name] = frame.sort(order, nulls_last=True)
    return out


def assert_same(left: Tables, right: Tables) -> None:
    assert left.keys() == right.keys()
    for name in left:
        try:
            assert_frame_equal(left[name], right[name], check_exact=True)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


def assert_reference(state: State, stream: Stream) -> None:
    """The engine's tables are a full reconcile of the whole log as the app stored it (read
    through the engine), and that is what the reference computes."""
    with open_engine(state.store) as engine:
        cur = engine.cursor
        raw, programs, partners = job.read(cur)
        expected = checked(raw, programs, partners, stream.now)
        assert_materialised(cur, expected)
