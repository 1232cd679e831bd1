"""Files tally creates hold emails, raw bodies and credential hashes: every one is 0600 and every
directory 0700, whatever the umask the process started with (ingest/private.py)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings, load_settings
from ingest.storage.factory import open_store
from tests.conftest import OP, OPERATOR_TOKEN, WEBHOOK_SECRET, make_world


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The umask most systems start a process with: files 0644, directories 0755."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _settings(database: str, data: Path) -> Settings:
    return load_settings(
        database=database,
        engine_dir=str(data / "engine"),
        operator_token=OPERATOR_TOKEN,
        base_url="http://testserver",
        stripe_webhook_secrets=WEBHOOK_SECRET,
        reconcile_interval_seconds=0,
    )


def _modes(root: Path) -> dict[str, str]:
    """Every file and directory under `root` (and itself), by path relative to it, with its mode."""
    found = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def _wide(modes: dict[str, str], root: Path) -> dict[str, str]:
    """The paths whose mode lets anyone but the owner in (or is not 0600 / 0700)."""
    return {
        name: mode for name, mode in modes.items() if mode != ("0o700" if (root / name).is_dir() else "0o600")
    }


def test_every_file_tally_creates_is_private_whatever_the_umask(
    backend: str, database: str, tmp_path: Path, loose_umask: None
) -> None:
    """Open a store (the data directory is tally's to create), write, reconcile, back up; then
    stat everything under the data directory: the embedded database, its .wal, journal, key
    index, lock, mirror and row store, the backup; on PostgreSQL the reconciler's working copy
    and its row store."""
    data = tmp_path / "data"
    embedded = backend == "duckdb"
    settings = _settings(str(data / "tally.duckdb") if embedded else database, data)
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        click = client.post(
            "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
        ).json()["data"]["click_id"]
        lead = {"customer_external_id": "cust_1", "click_id": click, "email": "buyer@example.com"}
        assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
        for n in range(3):
            assert world.sale(transaction_id=f"in_{n}").status_code == 200
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        if embedded:
            r = client.post("/api/v1/operator/backup", json={"path": str(data / "copy.duckdb")}, headers=OP)
            assert r.status_code == 200, r.text
        while_serving = _modes(data)
    after = _modes(data)
    if embedded:
        expected = {"tally.duckdb", "tally.duckdb.wal", "tally.duckdb.keys", "tally.duckdb.lock"}
        expected |= {"tally.duckdb.journal", "tally.duckdb.rows", "copy.duckdb"}
    else:
        expected = {"engine", "engine/reconcile.duckdb", "engine/reconcile.duckdb.rows", "engine/engine.lock"}
    assert expected <= set(while_serving), while_serving
    assert _wide(while_serving, data) == {}
    assert _wide(after, data) == {}


@pytest.mark.embedded
def test_an_older_releases_files_are_made_private_when_the_store_opens(
    backend: str, tmp_path: Path, loose_umask: None
) -> None:
    """A database whose files were made 0644 (and folders 0755) before this release is narrowed
    the next time a store opens it; so is a working copy's folder made by hand."""
    data = tmp_path / "data"
    database = data / "tally.duckdb"
    store = open_store(database)
    store.close()
    for path in data.rglob("*"):  # (the data directory itself is the operator's choice)
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert len(_wide(_modes(data), data)) >= 4
    store = open_store(database)
    try:
        assert _wide(_modes(data), data) == {}
    finally:
        store.close()

    from ingest.storage.postgres.copy import WorkingCopy as LocalEngine

    engine_dir = tmp_path / "engine"
    engine_dir.mkdir(mode=0o755)
    (engine_dir / "reconcile.duckdb.wal").write_bytes(b"")
    (engine_dir / "reconcile.duckdb.wal").chmod(0o644)
    engine = LocalEngine(str(engine_dir))
    try:
        assert _wide(_modes(engine_dir), engine_dir) == {}
    finally:
        engine.close()
