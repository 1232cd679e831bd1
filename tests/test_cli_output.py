"""What the CLI prints: progress only on a terminal's stderr and never under --json; tables drawn
on a terminal and tab-separated in a pipe; a failure in one line (`tally backup` once, without a
stray bar); `tally explain` of a sale not reconciled yet says so; `tally migrate --status` of a
file a running server holds reads the version through that server."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from api.cli.books import RECONCILE_HINT, REPORT_FORMATS, not_reconciled
from api.cli.errors import ApiError
from ingest.storage import migrations
from reports.render import DOUBLE_COUNTING_FORMATS, FINANCE_FORMATS
from tests.conftest import OP, OPERATOR_TOKEN, ROOT, LiveServer
from tests.test_cli import tally
from tests.test_cli_engineering import alices_sale

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _drain(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a terminal whose other end has closed reads EIO
            break
        if not chunk:
            break
        into.append(chunk)
    os.close(fd)


def run(
    home: Path, *args: str, stdout_tty: bool = False, stderr_tty: bool = False, **extra_env: str
) -> tuple[int, str, str]:
    """`tally ARGS` with stdout and/or stderr on a terminal (a pseudo-terminal) or a pipe;
    (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env |= {"XDG_CONFIG_HOME": str(home), "TERM": "xterm-256color", "COLUMNS": "160", **extra_env}
    ends = [pty.openpty() if tty else os.pipe() for tty in (stdout_tty, stderr_tty)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=ends[0][1],
        stderr=ends[1][1],
        env=env,
        cwd=ROOT,
    )
    outputs: list[list[bytes]] = [[], []]
    readers = []
    for (read_end, write_end), into in zip(ends, outputs, strict=True):
        os.close(write_end)
        readers.append(threading.Thread(target=_drain, args=(read_end, into)))
        readers[-1].start()
    code = proc.wait(timeout=120)
    for reader in readers:
        reader.join(timeout=30)
    out, err = (b"".join(chunks).decode() for chunks in outputs)
    return code, out.replace("\r\n", "\n"), err


def _account(url: str) -> tuple[dict[str, str], str]:
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "Shop"}, headers=owner
        ).json()["data"]["program_id"]
    return acct, pid


def test_progress_only_on_a_terminal_and_tables_only_on_a_terminal(
    live_server: LiveServer, tmp_path: Path
) -> None:
    url = live_server.url
    acct, pid = _account(url)
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0
    operator = {"TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN}

    code, out, err = run(home, "reconcile", stderr_tty=True, **operator)
    assert code == 0 and out.startswith("run rcr_"), err
    assert "reconcile" in ANSI.sub("", err) and ANSI.search(err)  # drawn, then cleared
    code, out, err = run(home, "reconcile", "--json", stderr_tty=True, **operator)
    assert code == 0 and json.loads(out)["run_id"].startswith("rcr_") and err == ""  # --json: none
    code, out, err = run(home, "reconcile", **operator)
    assert code == 0 and out.startswith("run rcr_") and err == ""  # stderr not a terminal: none
    code, out, err = run(
        home, "backfill", "--program", pid, "--from", "2026-01-01", "--to", "2026-01-31", "--json"
    )
    assert code == 0 and json.loads(out)["dry_run"] is True and err == ""

    code, out, err = run(home, "programs", "list", stdout_tty=True)
    assert code == 0, err
    drawn = ANSI.sub("", out)
    assert "\u2503 program " in drawn and "\u2502 Shop \u2502" in drawn and "\t" not in drawn  # a drawn table
    code, out, err = run(home, "programs", "list")
    [row] = out.splitlines()
    assert code == 0 and row.split("\t")[:2] + row.split("\t")[3:] == [pid, acct["workspace_id"], "Shop"]

    # a refused backup: its reason once, in one line, with no progress left behind
    taken = tmp_path / "taken.duckdb"
    taken.write_bytes(b"")
    code, out, err = run(home, "backup", "-o", str(taken), **operator)
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("tally: validation_error: ") and line.count("already exists") == 1
    code, out, err = run(home, "backup", "-o", str(taken), stderr_tty=True, **operator)
    assert code == 1 and ANSI.sub("", err).count("already exists") == 1
    assert ANSI.sub("", err).rstrip().splitlines()[-1] == line  # the last thing left on the screen


def test_explain_says_a_sale_is_waiting_for_the_reconciler(live_server: LiveServer, tmp_path: Path) -> None:
    url = live_server.url
    acct, pid = _account(url)
    alices_sale(url, {"Authorization": f"Bearer {acct['token']}"}, pid, {"transaction_id": "in_fresh"})
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0

    r = tally(home, "explain", "--program", pid, "--transaction", "in_fresh")
    assert r.returncode == 1 and r.stdout == ""
    [line] = r.stderr.splitlines()
    # the server says the sale is recorded but not reconciled yet, and how to run the reconciler
    assert line.startswith("tally: sale_not_found: ") and "not reconciled yet" in line
    assert "tally reconcile" in line
    r = tally(home, "explain", "--program", pid, "--transaction", "in_never_sent")
    assert (
        r.returncode == 1
        and r.stderr.startswith("tally: sale_not_found:")
        and "tally reconcile" not in r.stderr
    )

    assert tally(home, "reconcile", "--url", url, TALLY_OPERATOR_TOKEN=OPERATOR_TOKEN).returncode == 0
    r = tally(home, "explain", "--program", pid, "--transaction", "in_fresh")
    assert r.returncode == 0 and "answer: attributed to alice" in r.stdout, r.stderr


def test_explain_passes_on_the_servers_own_hint() -> None:
    """When the server says the sale is not reconciled yet (a hint in the envelope, or its
    message), the CLI says so without looking in the tracking log itself."""
    said = ApiError(404, "sale_not_found", "no reconciled sale x", [], {"hint": "x is in the raw log."})
    assert not_reconciled(said, "prog_1", "x") == f"x is in the raw log: {RECONCILE_HINT}"
    told = ApiError(404, "sale_not_found", "no reconciled sale x", [], {"hint": "run `tally reconcile`"})
    assert not_reconciled(told, "prog_1", "x") == "run `tally reconcile`"
    flagged = ApiError(404, "sale_not_found", "no reconciled sale x", [], {"reconciled": False})
    assert not_reconciled(flagged, "prog_1", "x") == f"not reconciled yet: {RECONCILE_HINT}"
    worded = ApiError(404, "sale_not_found", "sale x is not reconciled yet", [], {})
    assert not_reconciled(worded, "prog_1", "x") == f"not reconciled yet: {RECONCILE_HINT}"


def test_an_errors_field_detail_is_said_once() -> None:
    same = ApiError(
        422, "validation_error", "/x already exists", [{"field": "path", "message": "/x already exists"}], {}
    )
    assert str(same) == "validation_error: /x already exists"
    more = ApiError(
        422, "validation_error", "invalid query", [{"field": "period", "message": "must be YYYY-MM"}], {}
    )
    assert str(more) == "validation_error: invalid query (period: must be YYYY-MM)"
    assert ApiError(401, "account_token_required", "m", [], {}).exit_code == 4
    assert ApiError(403, "owner_required", "m", [], {}).exit_code == 4
    assert ApiError(404, "program_not_found", "m", [], {}).exit_code == 1


def test_the_cli_offers_the_report_formats_the_server_renders() -> None:
    assert REPORT_FORMATS == {"finance": FINANCE_FORMATS, "double-counting": DOUBLE_COUNTING_FORMATS}


def test_migrate_status_reads_a_held_file_through_its_server(live_server: LiveServer, tmp_path: Path) -> None:
    database = str(live_server.database)
    held = f"(process {live_server.process.pid})"
    r = tally(tmp_path, "migrate", "--database", database, "--status", "--url", live_server.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{database}: schema version {migrations.LATEST} (this tally knows up to {migrations.LATEST}); "
        f"read through {live_server.url}, the server holding it {held}"
    ]
    r = tally(tmp_path, "migrate", "--database", database, "--status", TALLY_URL=live_server.url)
    assert r.returncode == 0 and held in r.stdout, r.stderr
    r = tally(tmp_path, "migrate", "--database", database, "--status", "--url", "http://127.0.0.1:9")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert f"is held by process {live_server.process.pid}" in r.stderr and "--url" in r.stderr
    r = tally(tmp_path, "migrate", "--database", database)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "is a `tally serve` running on it?" in r.stderr
    assert f"held by process {live_server.process.pid}" in r.stderr
