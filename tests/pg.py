"""A PostgreSQL cluster of the tests' own: Debian's server binaries (initdb, pg_ctl), in a
temporary directory, on a free port, started and stopped by the tests themselves.

Nothing depends on a system service being up: `make test` installs the server packages when
they are missing, and each pytest worker starts one cluster for its session. Each test gets a
database of its own, copied from a migrated template (`fresh_database`). Tests that need to stop
and restart the database (faults) start a cluster of their own with `Cluster`.

Run as root (the CI machine), the server runs as the `postgres` user, as initdb requires.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from ingest.storage import migrations
from ingest.storage.sql import PgExecutor

TEMPLATE = "tally_template"


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not candidates:
        raise RuntimeError(
            "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: `make test` installs"
            " Debian's postgresql package"
        )
    return Path(candidates[-1]).parent


def _free_port() -> int:
    """A port nothing listens on right now (another process may take it first: see `Cluster`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pg_dump(url: str) -> bytes:
    """Every table of the database at `url`, schema and rows, as pg_dump writes them."""
    done = subprocess.run([str(_bindir() / "pg_dump"), "--dbname", url], capture_output=True, check=True)
    return done.stdout


class Cluster:
    """One PostgreSQL server in a directory of its own (see the module docstring)."""

    def __init__(self, durable: bool = False) -> None:
        """`durable`: fsync as in production (for crash tests); off by default, for speed."""
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="tally-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "-N"
        )
        settings = [
            f"port = {self.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.root}'",
            "max_connections = 200",
            "shared_buffers = 64MB",
            "log_min_messages = fatal",
        ]
        if not durable:
            settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n".join(settings) + "\n")
        self._start_on_a_free_port()

    def _start_on_a_free_port(self) -> None:
        """Start; when another process took the chosen port first, choose again (the last
        `port` line of postgresql.conf wins)."""
        log = self.root / "server.log"
        for attempt in range(5):
            logged = log.stat().st_size if log.exists() else 0
            try:
                self.start()
                return
            except RuntimeError:
                if not log.exists() or attempt == 4:
                    raise
                with open(log, "rb") as lines:
                    lines.seek(logged)
                    if b"could not create any TCP/IP sockets" not in lines.read():
                        raise
            self.port = _free_port()
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(f"port = {self.port}\n")

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bindir / program), *args]
        if self._user is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Stop (fast: sessions are ended) and start again: every client connection is gone."""
        self.stop("fast")
        self.start()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        with psycopg.connect(self.url(database), autocommit=True) as con:
            con.execute(sql.encode())

    def create_database(self, template: str | None = None) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        self.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        return name

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Server:
    """The session's cluster, with a migrated template database to copy for each test."""

    def __init__(self) -> None:
        self.cluster = Cluster()
        self.cluster.execute(f"CREATE DATABASE {TEMPLATE}")
        with psycopg.connect(self.cluster.url(TEMPLATE), autocommit=True) as con:
            migrations.apply(PgExecutor(con))

    def fresh_database(self) -> str:
        """The URL of a new, migrated, empty database (an identity of its own)."""
        name = self.cluster.create_database(TEMPLATE)
        self.cluster.execute(
            "UPDATE tally_meta SET value = md5(random()::text) WHERE name = 'identity'", name
        )
        return self.cluster.url(name)

    def close(self) -> None:
        self.cluster.close()
