"""`tally serve` writes its logs as TALLY_LOG_FORMAT says, one access line per request (uvicorn's
own access log off), each logger named once, APScheduler's chatter quiet, a line when it stops;
and refuses a malformed observability setting with a one-line reason."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from api.observability import configure_logging, stop_logging
from api.settings import load_settings
from tests.conftest import OP, OPERATOR_TOKEN, ROOT, start_server


@pytest.mark.parametrize(
    ("name", "value"),
    [("TALLY_LOG_FORMAT", "xml"), ("TALLY_LOG_LEVEL", "loud"), ("TALLY_METRICS_PUBLIC", "maybe")],
)
def test_serve_refuses_a_malformed_observability_setting(tmp_path: Path, name: str, value: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env.update({"TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN, name: value})
    database = str(tmp_path / "refused.duckdb")
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "serve", "--port", "1", "--database", database],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tally: refusing to start:") and name in lines[0], lines


@pytest.mark.slow
def test_serve_writes_one_json_access_line_per_request(tmp_path: Path) -> None:
    server = start_server(tmp_path / "logs.duckdb", TALLY_LOG_FORMAT="json", TALLY_METRICS_PUBLIC="1")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            ids = [f"serve-logs-{n}" for n in range(3)]
            assert c.get("/healthz", headers={"X-Request-Id": ids[0]}).status_code == 200
            assert c.get("/metrics", headers={"X-Request-Id": ids[1]}).status_code == 200  # public
            r = c.post("/api/v1/track/sale", json={}, headers={"X-Request-Id": ids[2], **OP})
            assert r.status_code == 401
    finally:
        server.process.terminate()
        _, err = server.process.communicate(timeout=30)
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]  # all JSON
    access = [x for x in lines if x["logger"] == "tally.access"]
    ours = sorted(x["request_id"] for x in access if x["request_id"].startswith("serve-logs-"))
    assert ours == ids  # once each: uvicorn's own access log is off
    assert not [x for x in lines if x["logger"].startswith("uvicorn.access")]
    assert all(x["request_id"] for x in access)  # the start-up probes' lines carry ids too
    by_id = {x["request_id"]: x for x in access}
    assert (by_id[ids[0]]["route"], by_id[ids[0]]["status"]) == ("/healthz", 200)
    assert (by_id[ids[2]]["route"], by_id[ids[2]]["status"]) == ("/api/v1/track/sale", 401)
    assert any("accepting writes" in x["message"] for x in lines)


TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) (.*)$"
)


def _scheduled_runs(url: str) -> float:
    """Scheduled reconcile runs so far, from the server's metrics (full and incremental)."""
    text = httpx.get(url + "/metrics", headers=OP, timeout=10).text
    found = re.findall(r'^tally_reconcile_duration_seconds_count\{mode="\w+"\} (\S+)$', text, re.MULTILINE)
    return sum(float(n) for n in found)


@pytest.mark.slow
def test_serve_lines_name_their_logger_once_the_scheduler_is_quiet_and_the_stop_is_logged(
    tmp_path: Path,
) -> None:
    """APScheduler's INFO chatter (job added, scheduler started, each run's `Running job` and
    `executed successfully`) stays out beside tally.reconcile's own line per run; no message
    repeats the logger's `tally` as a `tally:` prefix; SIGTERM ends with a `stopped` line."""
    server = start_server(tmp_path / "quiet.duckdb", TALLY_RECONCILE_INTERVAL_SECONDS="1")
    try:
        deadline = time.monotonic() + 60
        while _scheduled_runs(server.url) < 2:
            assert time.monotonic() < deadline, "two scheduled reconcile runs within 60 s"
            time.sleep(0.2)
    finally:
        server.process.terminate()
        _, err = server.process.communicate(timeout=30)
    assert server.process.returncode == -signal.SIGTERM  # uvicorn raises the signal again once stopped
    lines = [line for line in err.decode().splitlines() if line.strip()]
    parsed = [TEXT_LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed, strict=True) if m is None]
    leveled = [(m.group(1), m.group(2), m.group(3)) for m in parsed if m]
    chatter = [r for r in leveled if r[1].startswith("apscheduler") and r[0] in ("DEBUG", "INFO")]
    assert chatter == []  # (a WARNING, such as a run skipped while the previous one runs, still shows)
    records = [(logger, message) for _, logger, message in leveled]
    assert [r for r in records if r[1].startswith("tally:")] == []  # never `INFO tally tally: ...`
    assert len([r for r in records if r[0] == "tally.reconcile"]) >= 2
    assert ("tally", f"database {server.database} open, accepting writes") in records
    assert records[-1] == ("tally", f"stopped: database {server.database} closed")


def test_library_chatter_is_quieted_to_warning_unless_debug(tmp_path: Path) -> None:
    scheduler = logging.getLogger("apscheduler")
    before = scheduler.level
    for level, effective in (("INFO", logging.WARNING), ("ERROR", logging.ERROR), ("DEBUG", logging.DEBUG)):
        settings = load_settings(
            database=str(tmp_path / "t.duckdb"), operator_token=OPERATOR_TOKEN, log_level=level
        )
        stream = io.StringIO()
        configure_logging(settings, stream)
        try:
            assert scheduler.getEffectiveLevel() == effective
            logging.getLogger("apscheduler.scheduler").info("Scheduler started")
            logging.getLogger("apscheduler.executors.default").warning("Run time of job was missed")
            logging.getLogger("tally").info("database open, accepting writes")
        finally:
            stop_logging()
        assert scheduler.level == before  # as it was
        written = stream.getvalue()
        assert ("Scheduler started" in written) is (level == "DEBUG")
        assert ("Run time of job was missed" in written) is (level != "ERROR")
        assert ("accepting writes" in written) is (level != "ERROR")


@pytest.mark.slow
def test_serve_stops_on_sigterm_even_when_nobody_reads_its_log(tmp_path: Path) -> None:
    """stderr a pipe nobody reads, filled past its buffer by access lines: the log writer's last
    write blocks, and the stop still ends the process (the flush is bounded, never a hang)."""
    server = start_server(tmp_path / "unread.duckdb")  # stderr=PIPE, not read until it has ended
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            for _ in range(2000):  # about 200 KB of access lines: past a 64 KiB pipe
                assert c.get("/healthz").status_code == 200
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)  # (before the bound: a hang here)
        if server.process.stderr:
            server.process.stderr.close()
    assert server.process.returncode == -signal.SIGTERM
