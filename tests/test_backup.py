"""`tally backup` and `POST /api/v1/operator/backup`: a copy taken while traffic flows holds every
write acknowledged before it started, exactly once, as a prefix of whole groups; a server starts on
it; the endpoint is operator-only and refuses a path that cannot take the copy with a 422."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from starlette.testclient import TestClient

from ingest.storage.duckdb.backup import check_target, copy_database
from ingest.storage.duckdb.journal import read_segment
from ingest.storage.factory import backup_offline
from ingest.storage.schema import RAW_EVENT_FIELDS
from tests.conftest import (
    OP,
    OPERATOR_TOKEN,
    ROOT,
    LiveServer,
    World,
    bearer,
    fill,
    live_program,
    start_server,
)
from tests.processes import Load, accepted_sales, kill, uncopied_batches

BACKUP = "/api/v1/operator/backup"


def _tally(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        cwd=ROOT,
        check=False,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _assert_standalone(copy: Path) -> None:
    """The copy is one self-contained file: no write-ahead file, no journal beside it."""
    assert copy.is_file()
    assert not Path(f"{copy}.wal").exists()
    assert not Path(f"{copy}.journal").exists()
    assert not Path(f"{copy}.partial").exists()


def _assert_whole_groups(copy: Path, original: Path | None) -> None:
    """The copy's raw log is a prefix of the original's (same rows, seq 1..n without a gap), and
    every row of a group came with it: each sale's tracking-log line and idempotency key."""
    with duckdb.connect(str(copy), read_only=True) as con:
        n, lo, hi = con.execute("SELECT count(*), min(seq), max(seq) FROM raw_events").fetchone() or (0, 0, 0)
        assert (lo, hi) == (1, n)
        copied = con.execute("SELECT * FROM raw_events ORDER BY seq").fetchall()
        orphans = con.execute(
            "SELECT count(*) FROM tracking_log WHERE raw_seq IS NOT NULL AND raw_seq > ?", [hi]
        ).fetchone()
        assert orphans == (0,)
        unlogged = con.execute(
            "SELECT count(*) FROM raw_events r WHERE r.kind = 'sale'"
            " AND NOT EXISTS (SELECT 1 FROM tracking_log l WHERE l.raw_seq = r.seq)"
        ).fetchone()
        assert unlogged == (0,)
        unkeyed = con.execute(
            "SELECT count(*) FROM raw_events r WHERE r.kind = 'sale' AND r.outcome = 'accepted'"
            " AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.raw_seq = r.seq)"
        ).fetchone()
        assert unkeyed == (0,)
        keys_beyond = con.execute("SELECT count(*) FROM idempotency_keys WHERE raw_seq > ?", [hi]).fetchone()
        assert keys_beyond == (0,)
    if original is None:
        return
    with duckdb.connect(str(original), read_only=True) as con:
        assert con.execute("SELECT * FROM raw_events WHERE seq <= ? ORDER BY seq", [hi]).fetchall() == copied


def _journaled_sales(db: Path) -> set[str]:
    """Sales in the journal's segments (journaled, not yet copied into DuckDB and dropped)."""
    found: set[str] = set()
    for segment in sorted(Path(f"{db}.journal").glob("*.log")):
        for record in read_segment(segment):
            found.update(str(row[_TXN]) for row in record["raw"] if row[_TXN] is not None)
    return found


_TXN = RAW_EVENT_FIELDS.index("transaction_id")


@pytest.mark.slow
def test_a_backup_taken_under_traffic_restores_every_acknowledged_write_once(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    copy = tmp_path / "backups" / "copy.duckdb"
    by_cli = tmp_path / "backups" / "by-cli.duckdb"
    copy.parent.mkdir()
    server = start_server(db)
    try:
        _, _, key = live_program(server.url)
        load = Load(server.url, key, workers=4)
        load.wait_for(400)
        acked_before = list(load.acked)  # acknowledged before the backup is asked for
        # Asked for at once, so the newest of those are still only in the journal (the copier
        # moves rows into DuckDB once a second).
        journal_only = _journaled_sales(db) & set(acked_before)
        r = httpx.post(server.url + BACKUP, json={"path": str(copy)}, headers=OP, timeout=120)
        more = len(load.acked)
        # The CLI, with its progress display, while traffic still flows.
        done = _tally(
            "backup", "--url", server.url, "--output", str(by_cli), TALLY_OPERATOR_TOKEN=OPERATOR_TOKEN
        )
        load.wait_for(len(load.acked) + 100)  # traffic flowed during the backups and flows after
        acked_all = load.stop()
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    assert r.json()["data"]["path"] == str(copy)
    assert journal_only, "no acknowledged sale was only in the journal when the backup began"
    assert done.returncode == 0, done.stderr
    assert f"wrote {by_cli}" in done.stdout
    assert len(acked_before) >= 400 and len(acked_all) > more
    _assert_standalone(by_cli)
    _assert_whole_groups(by_cli, db)
    _assert_standalone(copy)

    # The original holds everything; the copy a prefix of whole groups with all acknowledged before.
    _assert_whole_groups(copy, db)
    stored = accepted_sales(copy)
    assert [t for t in acked_before if t not in stored] == []
    assert {t: n for t, n in stored.items() if n > 1} == {}

    # A server starts on the copy, knows those sales (a repeat is a duplicate) and takes new ones.
    restored = start_server(copy)
    try:
        with httpx.Client(base_url=restored.url, timeout=10, headers=bearer(key)) as c:
            sale = {"transaction_id": acked_before[0], "customer_external_id": "c", "amount": 100}
            r = c.post("/api/v1/track/sale", json=sale)
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "duplicate_transaction"
            r = c.post("/api/v1/track/sale", json={**sale, "transaction_id": "after_restore"})
            assert r.status_code == 200, r.text
    finally:
        restored.stop()
    after = accepted_sales(copy)
    assert after["after_restore"] == 1
    assert {t: n for t, n in after.items() if n > 1} == {}


@pytest.mark.slow
def test_offline_backup_includes_rows_only_in_the_journal(tmp_path: Path) -> None:
    db = tmp_path / "crashed.duckdb"
    copy = tmp_path / "copy.duckdb"
    server = start_server(db)
    _, _, key = live_program(server.url)
    load = Load(server.url, key)
    load.wait_for(800)
    kill(server.process)  # the copier moves rows once a second: the newest are journal-only
    acked = load.stop()
    assert uncopied_batches(db) > 0

    done = _tally("backup", "--database", str(db), "--output", str(copy))
    assert done.returncode == 0, done.stderr
    _assert_standalone(copy)
    stored = accepted_sales(copy)
    assert [t for t in acked if t not in stored] == []
    assert {t: n for t, n in stored.items() if n > 1} == {}
    _assert_whole_groups(copy, db)


@contextlib.contextmanager
def loose_umask() -> Iterator[None]:
    """The umask most systems start a process with (files 0644); this process's own may already
    be tally's 077, set by a store a test opened in-process."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.slow
def test_backups_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """A copy holds partner emails, raw bodies and credential hashes: the server writes it 0600
    (owner only) when started under umask 022, and so does an offline backup."""
    db = tmp_path / "private.duckdb"
    with loose_umask():
        server = start_server(db)
    try:
        auth, program_id, _ = live_program(server.url)
        partner = {"code": "alice", "name": "Alice", "email": "alice@partner.test"}
        r = httpx.post(f"{server.url}/api/v1/programs/{program_id}/partners", json=partner, headers=auth)
        assert r.status_code == 201, r.text
        served = tmp_path / "served.duckdb"
        r = httpx.post(server.url + BACKUP, json={"path": str(served)}, headers=OP, timeout=120)
        assert r.status_code == 200, r.text
    finally:
        server.stop()
    offline = tmp_path / "offline.duckdb"
    with loose_umask():
        backup_offline(str(db), str(offline), lambda stage, done, total: None)
    for copy in (served, offline):
        _assert_standalone(copy)
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600, (copy, oct(copy.stat().st_mode))
        with duckdb.connect(str(copy), read_only=True) as con:
            assert con.execute("SELECT email FROM partners").fetchall() == [("alice@partner.test",)]


def test_offline_backup_of_a_postgresql_database_is_refused_in_one_line(tmp_path: Path) -> None:
    url = "postgresql://tally:secret@127.0.0.1:5432/tally"
    done = _tally("backup", "--database", url, "--output", str(tmp_path / "copy.duckdb"))
    assert done.returncode != 0
    assert "pg_dump" in done.stderr and "secret" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "copy.duckdb").exists()


def test_offline_backup_refuses_a_database_a_server_holds(live_server: LiveServer, tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"  # the live_server fixture's database
    done = _tally("backup", "--database", str(db), "--output", str(tmp_path / "copy.duckdb"))
    assert done.returncode != 0
    assert "without --database" in done.stderr
    assert not (tmp_path / "copy.duckdb").exists()


@pytest.mark.embedded
def test_the_endpoint_answers_with_the_summary_and_the_copy_opens(
    client: TestClient, world: World, tmp_path: Path
) -> None:
    sold = world.sale(transaction_id="t1")
    assert sold.status_code == 200, sold.text
    target = tmp_path / "copy.duckdb"
    r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data["path"] == str(target)
    assert data["rows"]["raw_events"] == data["last_seq"] >= 1
    assert data["bytes"] == target.stat().st_size
    _assert_standalone(target)
    assert accepted_sales(target) == {"t1": 1}


@pytest.mark.embedded
def test_the_endpoint_streams_progress_lines(client: TestClient, world: World, tmp_path: Path) -> None:
    target = tmp_path / "copy.duckdb"
    headers = {**OP, "Accept": "application/x-ndjson"}
    r = client.post(BACKUP, json={"path": str(target)}, headers=headers)
    assert r.status_code == 200
    lines = [line for line in r.text.splitlines() if line]
    assert any('"progress"' in line and "raw_events" in line for line in lines)
    assert '"data"' in lines[-1]
    assert target.is_file()


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_credentials"),
        ({"Authorization": "Token x"}, "malformed_authorization"),
        (bearer("op-wrong-token-0123456789abcdef"), "operator_token_required"),
    ],
)
def test_the_endpoint_is_for_the_operator_only(
    client: TestClient, tmp_path: Path, headers: dict[str, str], code: str
) -> None:
    target = tmp_path / "copy.duckdb"
    r = client.post(BACKUP, json={"path": str(target)}, headers=headers)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == code
    assert not target.exists()


def test_an_account_token_is_not_the_operator(client: TestClient, world: World, tmp_path: Path) -> None:
    target = tmp_path / "copy.duckdb"
    for auth in (world.key, world.owner):
        r = client.post(BACKUP, json={"path": str(target)}, headers=auth)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "operator_token_required"
    assert not target.exists()


def _bad_paths(tmp_path: Path, database: Path) -> list[str]:
    existing = tmp_path / "existing.duckdb"
    existing.write_bytes(b"keep me")
    return [
        "copy.duckdb",  # relative
        str(tmp_path / "missing-dir" / "copy.duckdb"),
        str(existing),
        str(tmp_path),  # a directory
        str(tmp_path) + "/",
        str(database),
        f"{database}.journal/copy.duckdb",
        "",
        str(tmp_path / ("n" * 256)),  # over the system's 255 bytes
        str(tmp_path / ("é" * 122 + ".duckdb")),  # 251 bytes: its .partial would be over
        str(tmp_path / ("n" * 244)),  # one byte too long for <name>.partial.wal
        str(tmp_path / ("d" * 300) / "copy.duckdb"),  # a directory name over 255 bytes
        "/" + "d/" * 2100 + "copy.duckdb",  # a path over PATH_MAX
    ]


@pytest.mark.embedded
def test_a_path_that_cannot_take_the_copy_is_a_422_envelope(client: TestClient, tmp_path: Path) -> None:
    database = tmp_path / "tally.duckdb"  # the `settings` fixture's database
    for path in _bad_paths(tmp_path, database):
        r = client.post(BACKUP, json={"path": path}, headers=OP)
        assert r.status_code == 422, (path, r.text)
        error = r.json()["error"]
        assert error["code"] == "validation_error"
        assert set(error) >= {"code", "message", "doc_url"}
    assert (tmp_path / "existing.duckdb").read_bytes() == b"keep me"
    for body in ({}, {"path": 5}, {"path": str(tmp_path / "x.duckdb"), "extra": 1}):
        r = client.post(BACKUP, json=body, headers=OP)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "validation_error"
    r = client.post(BACKUP, content=b"not json", headers=OP)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


@pytest.mark.embedded
def test_the_longest_file_name_the_copy_can_have_is_taken(client: TestClient, tmp_path: Path) -> None:
    target = tmp_path / ("n" * 243)  # 243 + len(".partial.wal") = 255
    r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
    assert r.status_code == 200, r.text
    _assert_standalone(target)


@pytest.mark.embedded
def test_a_partial_copy_left_by_a_killed_backup_does_not_block_the_path(
    client: TestClient, world: World, tmp_path: Path
) -> None:
    """A backup killed mid-copy leaves `<path>.partial` (and maybe its `.wal`): nobody holds it,
    so the next backup to that path replaces it."""
    assert world.sale(transaction_id="t1").status_code == 200
    target = tmp_path / "copy.duckdb"
    Path(f"{target}.partial").write_bytes(b"half a copy" * 1000)
    Path(f"{target}.partial.wal").write_bytes(b"its wal")
    r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
    assert r.status_code == 200, r.text
    _assert_standalone(target)
    assert not Path(f"{target}.partial.wal").exists()
    assert accepted_sales(target) == {"t1": 1}


@pytest.mark.embedded
def test_a_partial_copy_another_process_is_writing_is_left_alone(
    client: TestClient, world: World, tmp_path: Path
) -> None:
    """A `<path>.partial` a live process has open (DuckDB's lock on it) is a backup under way:
    refused with a 422 naming the path, the file untouched; once that process is gone, it is
    stale and the next backup replaces it."""
    target = tmp_path / "copy.duckdb"
    partial = Path(f"{target}.partial")
    script = (
        "import duckdb, sys; c = duckdb.connect(sys.argv[1]); c.execute('CREATE TABLE t(x INT)');"
        " print('open', flush=True); sys.stdin.read()"
    )
    args = [sys.executable, "-c", script, str(partial)]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "open\n"
            before = partial.read_bytes()
            r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
            assert r.status_code == 422, r.text
            error = r.json()["error"]
            assert error["code"] == "validation_error" and error["fields"][0]["field"] == "path"
            assert "another process" in error["message"]
            assert partial.read_bytes() == before and not target.exists()
        finally:
            holder.kill()
    r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
    assert r.status_code == 200, r.text
    _assert_standalone(target)


@pytest.mark.parametrize("room", [0, 64 * 1024, 1024 * 1024])
@pytest.mark.embedded
def test_a_full_disk_at_the_target_is_a_422_and_leaves_nothing(
    client: TestClient, world: World, small_disk: Path, room: int
) -> None:
    """No room at all (the copy cannot be created), or some (it runs out half-way)."""
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - room)
    target = small_disk / "copy.duckdb"
    try:
        r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "validation_error"
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    finally:
        os.unlink(filler)
    r = client.post(BACKUP, json={"path": str(target)}, headers=OP)  # with room again, it works
    assert r.status_code == 200, r.text
    _assert_standalone(target)


def test_the_cli_reports_a_refusal_in_one_line(live_server: LiveServer, tmp_path: Path) -> None:
    url = live_server.url
    done = _tally(
        "backup", "--url", url, "-o", str(tmp_path / "nope" / "c.duckdb"), TALLY_OPERATOR_TOKEN=OPERATOR_TOKEN
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("tally: validation_error: directory")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "api.cli",
            "backup",
            "--url",
            url,
            "--token-stdin",
            "-o",
            str(tmp_path / "c.duckdb"),
        ],
        cwd=ROOT,
        check=False,
        input="op-wrong-token-0123456789abcdef\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TALLY_OPERATOR_TOKEN"},
    )
    assert done.returncode == 4  # an authentication failure (the server answered 401)
    assert "operator_token_required" in done.stderr
    assert not (tmp_path / "c.duckdb").exists()


@pytest.mark.embedded
def test_writes_committed_during_the_copy_stay_out_of_it(
    client: TestClient, world: World, tmp_path: Path
) -> None:
    """The copy reads one snapshot: sales acknowledged and copied into DuckDB while the tables are
    being copied (here, between raw_events and tracking_log) are in none of its tables."""
    st = client.app.state.tally  # type: ignore[attr-defined]
    assert world.sale(transaction_id="before").status_code == 200
    target = tmp_path / "copy.duckdb"
    injected: list[str] = []

    def progress(stage: str, done: int, total: int) -> None:
        if stage == "copying tracking_log" and not injected:
            for n in range(3):
                injected.append(f"during_{n}")
                assert world.sale(transaction_id=injected[-1]).status_code == 200
            st.writer.sync_blocking()  # in DuckDB now, not only in the journal

    with st.store._cursor() as cur:
        copy_database(cur, check_target(str(target), st.settings.database), st.writer.sync_blocking, progress)
    assert injected
    assert accepted_sales(target) == {"before": 1}
    _assert_whole_groups(target, None)


@pytest.mark.shared
def test_a_shared_database_is_not_copied_by_tally(client: TestClient, tmp_path: Path) -> None:
    """On PostgreSQL the endpoint refuses before any work and says what backs it up instead."""
    target = tmp_path / "copy.duckdb"
    r = client.post(BACKUP, json={"path": str(target)}, headers=OP)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "validation_error"
    assert "pg_dump" in r.json()["error"]["message"]
    assert not target.exists()
