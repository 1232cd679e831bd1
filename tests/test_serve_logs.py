"""`tally serve` writes its logs as TALLY_LOG_FORMAT says, one access line per request (uvicorn's
own access log off), and refuses a malformed observability setting with a one-line reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

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
