"""Versioned schema migrations (ingest/migrations.py): a database of the release before versions
is adopted with every row kept; versions are applied in order, each all or nothing; a database
newer than this tally is refused, by `tally serve` in one line."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.cli import main
from api.settings import Settings
from ingest.storage import migrations
from ingest.storage.duckdb.journal import Journal
from ingest.storage.duckdb.store import DuckStore
from tests.conftest import OP, OPERATOR_TOKEN, ROOT, WEBHOOK_SECRET, World, make_world
from tests.helpers import ACCOUNT, deliver, journal_record, query, renewal_event, sale_row, sql_rows

OLD_SCHEMA = Path(__file__).resolve().parents[1] / "fixtures" / "schema-0.1.sql"


def _tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() ORDER BY table_name"
    ).fetchall()
    return [str(r[0]) for r in rows]


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[str, str]]]:
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() ORDER BY table_name, column_index"
    ).fetchall()
    out: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in rows:
        out.setdefault(str(table), []).append((str(column), str(kind)))
    return out


def _contents(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, each table's columns as tally 0.1 had them (the columns later
    migrations added, empty on old rows, are left out: the rows kept are what is compared)."""
    con = duckdb.connect(str(path), read_only=True)
    added = {"raw_events": ("promo_code",), "rc_runs": ("part", "parts")}
    try:
        out = {}
        for t in _tables(con):
            if t == "schema_version":
                continue
            names = [c for c, _ in _columns(con)[t] if c not in added.get(t, ())]
            columns = ", ".join(f'"{c}"' for c in names)
            out[t] = sorted(con.execute(f'SELECT {columns} FROM "{t}"').fetchall(), key=repr)
        return out
    finally:
        con.close()


def _traffic(world: World) -> None:
    c = world.client
    click = c.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    assert click.status_code < 300, click.text
    lead = {
        "customer_external_id": "cust_1",
        "click_id": click.json()["data"]["click_id"],
        "email": "c@x.test",
    }
    assert c.post("/api/v1/track/lead", json=lead, headers=world.key).status_code < 300
    assert world.sale(transaction_id="in_1", amount=4_200).status_code < 300
    refund = {"transaction_id": "in_1", "refund_id": "re_1", "amount": 200}
    assert c.post("/api/v1/track/refund", json=refund, headers=world.key).status_code < 300
    assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200


# A claim as releases before schema version 10 made it: a sale's id untagged.
UNTAGGED = "CASE WHEN key LIKE 'sale:%' THEN substr(key, 6) ELSE key END"


def _tagged(contents: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """`contents` of a database before schema version 10 as it is after: the claims of sales
    (the rows of the test's traffic: sale `in_1` is seq 3, refund `re_1` seq 4) tagged."""
    keys = [(p, f"sale:{k}" if seq == 3 else k, seq) for p, k, seq in contents["idempotency_keys"]]
    return {**contents, "idempotency_keys": sorted(keys, key=repr)}


def _old_release_database(settings: Settings, target: Path) -> World:
    """A database as tally 0.1 left it: its schema (tests/fixtures/schema-0.1.sql, no
    `schema_version`), holding the rows real traffic and a reconcile wrote (made by today's app,
    whose tables are the same, then copied across)."""
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        _traffic(world)
    old = duckdb.connect(str(target))
    try:
        old.execute(OLD_SCHEMA.read_text())
        old.execute(f"ATTACH '{settings.database}' AS made (READ_ONLY)")
        baseline = set(_tables(old))
        made = old.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'made' ORDER BY table_name"
        ).fetchall()
        for (table,) in made:
            if table == "schema_version":
                continue
            if table in baseline:  # its 0.1 columns (later releases added some)
                columns = ", ".join(
                    f'"{name}"'
                    for (name,) in old.execute(
                        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database()"
                        " AND table_name = ? ORDER BY column_index",
                        [table],
                    ).fetchall()
                )
                if table == "idempotency_keys":  # sale ids were claimed untagged (migration 10)
                    columns = columns.replace('"key"', UNTAGGED)
                old.execute(f'INSERT INTO main."{table}" SELECT {columns} FROM made."{table}"')
            else:  # the reconciler's own tables (rc_*): created by its runs, as they were
                old.execute(f'CREATE TABLE main."{table}" AS SELECT * FROM made."{table}"')
        old.execute("DETACH made")
    finally:
        old.close()
    return world


def test_a_new_database_is_created_at_the_latest_version(tmp_path: Path) -> None:
    store = DuckStore(tmp_path / "new.duckdb")
    try:
        assert store.schema_version == migrations.LATEST
        history = migrations.history(store._con)
        assert [h.version for h in history] == [m.version for m in migrations.MIGRATIONS]
    finally:
        store.close()


def test_the_baseline_is_the_old_release_schema(tmp_path: Path) -> None:
    """Migration 1 creates exactly tally 0.1's tables and columns: adopting an old database
    changes none of them."""
    old = duckdb.connect(str(tmp_path / "old.duckdb"))
    old.execute(OLD_SCHEMA.read_text())
    new = duckdb.connect(str(tmp_path / "new.duckdb"))
    migrations.apply(new, migrations.MIGRATIONS[:1])
    assert {t: c for t, c in _columns(new).items() if t != "schema_version"} == _columns(old)


@pytest.mark.embedded
def test_a_database_of_the_release_before_versions_keeps_every_row(
    settings: Settings, tmp_path: Path
) -> None:
    old = tmp_path / "old.duckdb"
    world = _old_release_database(settings, old)
    before = _contents(old)
    assert sum(len(rows) for rows in before.values()) > 20 and "rc_sales" in before

    status = subprocess.run(
        [sys.executable, "-m", "api.cli", "migrate", "--database", str(old), "--status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "schema version 0" in status.stdout
    assert [line.split(":")[0] for line in status.stdout.splitlines()[1:]] == [
        f"pending {m.version}" for m in migrations.MIGRATIONS
    ]
    assert main(["migrate", "--database", str(old)]) == 0
    after = _contents(old)
    assert after == _tagged(before)
    assert [k for _, k, _ in after["idempotency_keys"]] == ["refund:re_1", "sale:in_1"]
    assert main(["migrate", "--database", str(old)]) == 0  # nothing left to do, nothing changed
    assert _contents(old) == after

    # served after the upgrade: the old key works, the old sale is still a duplicate
    upgraded = settings.model_copy(update={"database": str(old)})
    with TestClient(create_app(upgraded)) as client:
        assert client.get("/readyz").json()["data"]["schema_version"] == migrations.LATEST
        again = {"transaction_id": "in_1", "customer_external_id": "cust_1", "amount": 4_200}
        r = client.post("/api/v1/track/sale", json=again, headers=world.key)
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "duplicate_transaction"


@pytest.mark.embedded
def test_tally_serve_migrates_an_old_database_itself(settings: Settings, tmp_path: Path) -> None:
    old = tmp_path / "old.duckdb"
    _old_release_database(settings, old)
    before = _contents(old)
    store = DuckStore(old)
    try:
        assert store.schema_version == migrations.LATEST
    finally:
        store.close()
    assert _contents(old) == _tagged(before)


def _at(version: int, steps: list[str]) -> migrations.Migration:
    def run(con: duckdb.DuckDBPyConnection) -> None:
        for sql in steps:
            con.execute(sql)

    return migrations.Migration(version, f"test migration {version}", run)


def test_migrations_apply_in_order_each_all_or_nothing(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    n = migrations.LATEST
    later = _at(n + 1, ["CREATE TABLE later (x INTEGER)", "INSERT INTO later VALUES (1)"])
    broken = _at(n + 2, ["CREATE TABLE half (x INTEGER)", "INSERT INTO half VALUES ('not a number')"])
    applied = migrations.apply(con, [*migrations.MIGRATIONS, later])
    assert [m.version for m in applied] == list(range(1, n + 2))
    with pytest.raises(migrations.MigrationFailed, match=f"stays at version {n + 1}"):
        migrations.apply(con, [*migrations.MIGRATIONS, later, broken])
    assert migrations.current_version(con) == n + 1
    assert "half" not in _tables(con)
    assert con.execute("SELECT x FROM later").fetchall() == [(1,)]
    with pytest.raises(ValueError, match=r"numbered 1\.\.n"):
        migrations.apply(con, [*migrations.MIGRATIONS, _at(n + 2, [])])


def _too_new(path: Path) -> None:
    con = duckdb.connect(str(path))
    migrations.apply(con, [*migrations.MIGRATIONS, _at(migrations.LATEST + 1, [])])
    con.close()


def test_a_database_newer_than_this_tally_is_refused_in_one_line(tmp_path: Path) -> None:
    database = tmp_path / "newer.duckdb"
    _too_new(database)
    with pytest.raises(migrations.DatabaseTooNew):
        DuckStore(database)
    env = {
        "TALLY_DATABASE": str(database),
        "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN,
        "TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        "PATH": "/usr/bin:/bin",
    }
    serve = subprocess.run(
        [sys.executable, "-m", "api.cli", "serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert serve.returncode != 0
    reason = serve.stderr.strip()
    assert len(reason.splitlines()) == 1, reason
    assert f"schema version {migrations.LATEST + 1}, newer than this tally's {migrations.LATEST}" in reason
    migrate = subprocess.run(
        [sys.executable, "-m", "api.cli", "migrate", "--database", str(database)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert migrate.returncode == 1 and "newer than this tally" in migrate.stderr


HOLD = "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print(1, flush=True); input()"


def test_migrate_refuses_a_database_a_server_holds(tmp_path: Path) -> None:
    database = tmp_path / "held.duckdb"
    DuckStore(database).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(database)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        migrate = subprocess.run(
            [sys.executable, "-m", "api.cli", "migrate", "--database", str(database)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        holder.communicate("\n", timeout=30)
    assert migrate.returncode == 1
    assert "is a `tally serve` running on it?" in migrate.stderr
    assert len(migrate.stderr.strip().splitlines()) == 1
    # the holder has let go: migrate works again
    assert main(["migrate", "--database", str(database)]) == 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_tally_migrate_on_postgresql_takes_the_same_list_and_refuses_a_newer_database(
    pg_server: Any,
) -> None:
    """`tally migrate --database postgresql://...`: the same ordered list as an embedded file, one
    line per step, then nothing pending; a database migrated by a newer tally is refused in one
    line by `migrate` and by `serve`."""
    name = pg_server.cluster.create_database()
    url = pg_server.cluster.url(name)
    status = _cli("migrate", "--database", url, "--status")
    assert status.returncode == 0, status.stderr
    assert [line for line in status.stdout.splitlines() if line.startswith("pending")] == [
        f"pending {m.version}: {m.description}" for m in migrations.MIGRATIONS
    ]
    done = _cli("migrate", "--database", url)
    assert done.returncode == 0, done.stderr
    assert f"schema version 0 -> {migrations.LATEST}" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("applying")] == [
        f"applying {m.version}: {m.description}" for m in migrations.MIGRATIONS
    ]
    again = _cli("migrate", "--database", url)
    assert again.returncode == 0 and f"schema version {migrations.LATEST}, up to date" in again.stdout
    pg_server.cluster.execute(
        f"INSERT INTO schema_version VALUES ({migrations.LATEST + 1}, now(), 'from the future')", name
    )
    refused = _cli("migrate", "--database", url)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "newer than this tally" in refused.stderr
    serve = subprocess.run(
        [sys.executable, "-m", "api.cli", "serve", "--port", "0"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "TALLY_DATABASE": url,
            "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN,
            "TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert serve.returncode != 0 and len(serve.stderr.strip().splitlines()) == 1, serve.stderr
    assert (
        f"schema version {migrations.LATEST + 1}, newer than this tally's {migrations.LATEST}" in serve.stderr
    )


# -- schema version 10: claims tagged with their kind -----------------------------------------------
UNTAG = (  # (what each statement does to `{table}`, whose other columns are `{rest}`)
    "CREATE TEMP TABLE untagged AS SELECT program_id, key{rest} FROM {table} WHERE key LIKE 'sale:%'",
    "DELETE FROM {table} WHERE key LIKE 'sale:%'",
    "INSERT INTO {table} SELECT program_id, substr(key, 6){rest} FROM untagged",
    "DROP TABLE untagged",
)


def _untag(run: Callable[[str], object], table: str, rest: str = "") -> None:
    """`table`'s claims as releases before schema version 10 made them: sales' ids untagged
    (deleted and inserted: `sale:x` and `sale:sale:x` become `x` and `sale:x`)."""
    for sql in UNTAG:
        run(sql.format(table=table, rest=rest))


def _as_version_9(settings: Settings) -> None:
    """Turn the (closed) database back into what the release before schema version 10 left:
    its claims of sales untagged (`idempotency_keys`; PostgreSQL's `key_claims`; the embedded
    key index, then of format 3), at schema version 9."""
    if settings.database.startswith("postgresql"):
        with psycopg.connect(settings.database) as pg:  # one transaction
            _untag(lambda sql: pg.execute(sql.encode()), "idempotency_keys", ", raw_seq")
            _untag(lambda sql: pg.execute(sql.encode()), "key_claims")
            pg.execute(b"DELETE FROM schema_version WHERE version >= 10")
        return
    con = duckdb.connect(settings.database)
    try:
        _untag(con.execute, "idempotency_keys", ", raw_seq")
        con.execute("DELETE FROM schema_version WHERE version >= 10")
    finally:
        con.close()
    index = sqlite3.connect(f"{settings.database}.keys")
    try:
        assert index.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() == ("4",)
        _untag(index.execute, "claims")
        index.execute("UPDATE meta SET value = '3' WHERE name = 'format'")
        index.commit()
    finally:
        index.close()


def _promo(world: World, code: str, promotion_code_id: str) -> int:
    path = f"/api/v1/programs/{world.program_id}/partners/alice/promo-codes"
    body = {"code": code, "promotion_code_id": promotion_code_id}
    return world.client.post(path, json=body, headers=world.owner).status_code


def _refund(world: World, refund_id: str, txn: str) -> int:
    body = {"transaction_id": txn, "refund_id": refund_id, "amount": 10}
    return world.client.post("/api/v1/track/refund", json=body, headers=world.key).status_code


def test_claims_made_before_kinds_were_tagged_keep_their_meaning(settings: Settings) -> None:
    """A log of the release before schema version 10 where sales took ids that were a refund's
    and a promo code's claims (`refund:r77`, `promo_code:SPRING`), and ids that become each
    other's when tagged (`x`, `sale:x`): after the upgrade (migration 10; the embedded key index
    rebuilt from the log), refund r77 and promo code SPRING are taken, and every claim made
    before refuses its duplicate as it did, across a restart."""
    with TestClient(create_app(settings)) as client:
        world = make_world(client, stripe_account_id=ACCOUNT)
        for txn in ("refund:r77", "promo_code:SPRING", "promotion_code:promo_1", "x", "sale:x"):
            assert world.sale(transaction_id=txn).status_code == 200, txn
        assert _refund(world, "re_1", "x") == 200
        assert _promo(world, "AUTUMN", "promo_2") == 201
        assert (
            deliver(client, renewal_event("evt_old_1", "in_processor")).json()["data"]["duplicate"] is False
        )
        program = world.program_id
    _as_version_9(settings)
    if not settings.database.startswith("postgresql"):
        con = duckdb.connect(settings.database, read_only=True)
        old = con.execute("SELECT key FROM idempotency_keys ORDER BY key").fetchall()
        con.close()
        assert [k for (k,) in old] == [
            "evt_old_1",
            "in_processor",
            "promo_code:AUTUMN",
            "promo_code:SPRING",
            "promotion_code:promo_1",
            "promotion_code:promo_2",
            "refund:r77",
            "refund:re_1",
            "sale:x",
            "x",
        ]  # (as the release before left them: which is a sale's cannot be read from the key)
    with TestClient(create_app(settings)) as client:
        world.client = client
        assert client.get("/readyz").json()["data"]["schema_version"] == migrations.LATEST
        assert _refund(world, "r77", "refund:r77") == 200
        assert _promo(world, "SPRING", "promo_1") == 201
        for txn in (
            "refund:r77",
            "promo_code:SPRING",
            "promotion_code:promo_1",
            "x",
            "sale:x",
            "in_processor",
        ):
            r = world.sale(transaction_id=txn)
            assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_transaction"), txn
        assert world.sale(transaction_id="y").status_code == 200
        assert _refund(world, "re_1", "x") == 409
        assert _promo(world, "AUTUMN", "promo_9") == 409 and _promo(world, "OTHER", "promo_2") == 409
        assert deliver(client, renewal_event("evt_old_1", "in_processor")).json()["data"]["duplicate"] is True
        assert query(client, "SELECT program_id, key FROM idempotency_keys ORDER BY key") == [
            ("*", "evt_old_1"),
            *[
                (program, key)
                for key in (
                    "promo_code:AUTUMN",
                    "promo_code:SPRING",
                    "promotion_code:promo_1",
                    "promotion_code:promo_2",
                    "refund:r77",
                    "refund:re_1",
                    "sale:in_processor",
                    "sale:promo_code:SPRING",
                    "sale:promotion_code:promo_1",
                    "sale:refund:r77",
                    "sale:sale:x",
                    "sale:x",
                    "sale:y",
                )
            ],
        ]
    with TestClient(create_app(settings)) as client:  # restarted: the new claims hold too
        world.client = client
        assert _refund(world, "r77", "refund:r77") == 409
        assert _promo(world, "SPRING", "promo_1") == 409
        assert world.sale(transaction_id="y").status_code == 409
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        assert getattr(store, "set_aside", 0) == 0  # (embedded: every batch copied in)


@pytest.mark.embedded
def test_a_journal_of_the_release_before_is_copied_in_with_its_claims_tagged(tmp_path: Path) -> None:
    """Batches a release before schema version 10 journaled and did not copy (it was killed)
    hold untagged claims: copied in after the upgrade, each is tagged by the kind of the row that
    made it, so a refund of the id a sale took before is not refused by the table."""
    db = tmp_path / "j.duckdb"
    DuckStore(db).close()
    journal = Journal(Path(f"{db}.journal"))
    sale = {**sale_row(1), "transaction_id": "refund:r77"}
    record = journal_record(1, [sale])
    del record["tagged"]  # (as the release before journaled it)
    record["keys"] = [["p", "refund:r77", 10]]
    journal.append(record)
    journal.close()
    store = DuckStore(db)
    try:
        assert sql_rows(store, "SELECT program_id, key, raw_seq FROM idempotency_keys") == [
            ("p", "sale:refund:r77", 10)
        ]
        assert store.keys.claimed("p", "sale:refund:r77") and not store.keys.claimed("p", "refund:r77")
        tx = store.begin()
        refund = {**sale_row(2), "kind": "refund", "event_id": "rfd_1", "refund_id": "r77"}
        assert tx.claim_keys("p", ["refund:r77"], tx.append(refund)) == ["refund:r77"]
        tx.commit()
        store.flush()
        assert store.set_aside == 0
        assert sql_rows(store, "SELECT key FROM idempotency_keys ORDER BY key") == [
            ("refund:r77",),
            ("sale:refund:r77",),
        ]
    finally:
        store.close()
