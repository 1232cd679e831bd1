"""Shared fixtures: a real app on a real DuckDB file, and a world of account/program/key/partner."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import time_machine
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings, load_settings
from tests import hypothesis_profiles
from tests.pg import Server
from tests.receiver import Receiver

# -- hypothesis profiles: registered in tests/hypothesis_profiles.py, chosen by TALLY_HYPOTHESIS --
hypothesis_profiles.load()
# -- end of hypothesis profiles ---------------------------------------------------------------------

OPERATOR_TOKEN = "op-test-token-0123456789abcdef"
WEBHOOK_SECRET = "whsec_test_primary"
ROOT = Path(__file__).resolve().parents[1]


# -- the backends: every test that takes `backend` (through `database`, `settings`, `client`,
# `world`...) runs on the embedded DuckDB file and on PostgreSQL, unless it is marked `embedded`
# (it looks into the embedded backend's own files: journal, key index, DuckDB file, tmpfs faults),
# or `shared` (it checks what only a database several processes share does: PostgreSQL).
BACKENDS = ("duckdb", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("embedded") is not None:
            backends = BACKENDS[:1]
        elif metafunc.definition.get_closest_marker("shared") is not None:
            backends = BACKENDS[1:]
        else:
            backends = BACKENDS
        metafunc.parametrize("backend", backends, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    """This worker's PostgreSQL cluster (tests/pg.py), started once."""
    server = Server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh database of the test's backend: a DuckDB file, or a PostgreSQL database URL."""
    if backend == "postgresql":
        server: Server = request.getfixturevalue("pg_server")
        return server.fresh_database()
    return str(tmp_path / "tally.duckdb")


@pytest.fixture
def settings(database: str, tmp_path: Path) -> Settings:
    return load_settings(
        database=database,
        engine_dir=str(tmp_path / "engine"),
        operator_token=OPERATOR_TOKEN,
        base_url="http://testserver",
        stripe_webhook_secrets=f"{WEBHOOK_SECRET},whsec_test_rolled",
        reconcile_interval_seconds=0,
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


OP = bearer(OPERATOR_TOKEN)


@dataclass
class World:
    """An account owning a workspace with one program, its key and a partner."""

    client: TestClient
    account_token: str
    workspace_id: str
    program_id: str
    api_key: str
    partner_code: str = "alice"

    @property
    def owner(self) -> dict[str, str]:
        return bearer(self.account_token)

    @property
    def key(self) -> dict[str, str]:
        return bearer(self.api_key)

    def sale(self, **body: Any) -> httpx.Response:
        payload = {"transaction_id": "in_1", "customer_external_id": "cust_1", "amount": 1000}
        payload.update(body)
        return self.client.post("/api/v1/track/sale", json=payload, headers=self.key)

    def member(self, role: str = "member") -> dict[str, str]:
        r = self.client.post(
            f"/api/v1/workspaces/{self.workspace_id}/members",
            json={"email": f"{role}@example.com", "role": role},
            headers=self.owner,
        )
        assert r.status_code == 201, r.text
        return bearer(r.json()["data"]["token"])


def make_world(client: TestClient, **settings: Any) -> World:
    r = client.post(
        "/api/v1/operator/accounts", json={"email": "owner@brand.test", "workspace_name": "Brand"}, headers=OP
    )
    assert r.status_code == 201, r.text
    acct = r.json()["data"]
    r = client.post(
        "/api/v1/programs",
        json={"workspace_id": acct["workspace_id"], "name": "Brand partners", **settings},
        headers=bearer(acct["token"]),
    )
    assert r.status_code == 201, r.text
    program_id = r.json()["data"]["program_id"]
    r = client.post(f"/api/v1/programs/{program_id}/api-key", headers=bearer(acct["token"]))
    assert r.status_code == 201, r.text
    api_key = r.json()["data"]["api_key"]
    r = client.post(
        f"/api/v1/programs/{program_id}/partners",
        json={"code": "alice", "name": "Alice", "email": "alice@partner.test"},
        headers=bearer(acct["token"]),
    )
    assert r.status_code == 201, r.text
    return World(client, acct["token"], acct["workspace_id"], program_id, api_key)


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    """Time from 2026-01-01 09:00 UTC, ticking; a test moves it with `clock.move_to`."""
    with time_machine.travel(datetime(2026, 1, 1, 9, tzinfo=UTC), tick=True) as traveller:
        yield traveller


@pytest.fixture
def world(client: TestClient) -> World:
    return make_world(client)


# -- a small disk that tests fill up -------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs: the test fills it up to the last byte."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Fill `disk` completely with one file; return it (delete it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1024 * 1024, 4096, 1):  # down to the last byte
            try:
                while os.write(fd, bytes(size)):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


# -- a real server process ---------------------------------------------------------------------
def free_port() -> int:
    """A port nothing listens on right now. Another process may take it before the caller binds
    it: `start_server` checks that its own server holds the port and tries another if not."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds a listening TCP socket on `port` (Linux /proc), so that
    a server of another test that took the port first is never mistaken for this one."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # the process is gone
        return False
    for fd in descriptors:
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


@dataclass
class LiveServer:
    url: str
    database: Path  # or a postgresql:// URL
    process: subprocess.Popen[bytes]
    env: dict[str, str]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        if self.process.stderr:
            self.process.stderr.close()


class PortTaken(Exception):
    """Raised by `_serve` when another process took the chosen port first."""


def start_server(database: Path | str, port: int | None = None, **env: str) -> LiveServer:
    """`tally serve` on `database` as a process of its own, once it answers on its port: `port`,
    or a free one (another is tried when a process outside this test takes it first)."""
    for _attempt in range(1 if port else 5):
        try:
            return _serve(database, port or free_port(), env)
        except PortTaken:
            if port:
                raise
    raise RuntimeError("tally serve found every port it tried taken (5 attempts)")


def _serve(database: Path | str, port: int, env: dict[str, str]) -> LiveServer:
    full_env = {
        **os.environ,
        "TALLY_DATABASE": str(database),
        "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN,
        "TALLY_BASE_URL": f"http://127.0.0.1:{port}",
        "TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        "TALLY_RECONCILE_INTERVAL_SECONDS": "0",
        **env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=full_env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            if proc.stderr:
                proc.stderr.close()
            if "address already in use" in err:
                raise PortTaken(err)
            raise RuntimeError(f"tally serve exited early: {err}")
        if listens(proc.pid, port):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    kept = database if str(database).startswith("postgresql://") else Path(database)
                    return LiveServer(url, kept, proc, full_env)  # type: ignore[arg-type]
        time.sleep(0.1)
    proc.kill()
    proc.wait(10)
    if proc.stderr:
        proc.stderr.close()
    raise RuntimeError("tally serve did not become healthy in 60 s")


def live_program(url: str) -> tuple[dict[str, str], str, str]:
    """Through a live server: an account owning a program with a key; (owner auth, program, key)."""
    with httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP)
        acct = r.json()["data"]
        auth = bearer(acct["token"])
        r = c.post("/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=auth)
        pid = str(r.json()["data"]["program_id"])
        key = str(c.post(f"/api/v1/programs/{pid}/api-key", headers=auth).json()["data"]["api_key"])
    return auth, pid, key


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    server = start_server(tmp_path / "live.duckdb")
    try:
        yield server
    finally:
        server.stop()
        if server.process.stderr:
            server.process.stderr.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP receiver on loopback standing for a brand's server (tests/receiver.py)."""
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
