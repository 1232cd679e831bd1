"""The CLI's account commands are HTTP clients of a running server (CONTRACT section 10)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import OP, ROOT, LiveServer


def tally(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env["XDG_CONFIG_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_login_programs_and_keys(live_server: LiveServer, tmp_path: Path) -> None:
    acct = httpx.post(
        live_server.url + "/api/v1/operator/accounts",
        json={"email": "o@x.test", "workspace_name": "W"},
        headers=OP,
    ).json()["data"]
    home = tmp_path / "cfg"

    r = tally(home, "programs", "list")
    assert r.returncode != 0 and "not logged in" in r.stderr and len(r.stderr.strip().splitlines()) == 1

    r = tally(home, "login", "--url", live_server.url, "--token", "acct_wrong")
    assert r.returncode != 0 and "account_token_required" in r.stderr
    r = tally(home, "login", "--url", live_server.url, "--token", acct["token"])
    assert r.returncode == 0, r.stderr
    stored = home / "tally" / "credentials.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600

    r = tally(home, "programs", "create", "--workspace", acct["workspace_id"], "--name", "CLI program")
    assert r.returncode == 0, r.stderr
    assert '"api_token_masked"' in r.stdout and 'api_key"' not in r.stdout
    r = tally(home, "programs", "list")
    assert r.returncode == 0 and "CLI program" in r.stdout
    program_id = r.stdout.split("\t")[0]

    r = tally(home, "keys", "regenerate", "--program", program_id)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key.startswith("aff_")
    sale = httpx.post(
        live_server.url + "/api/v1/track/sale",
        json={"additional_data": {"test_mode": True}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert sale.status_code == 200

    r = tally(home, "keys", "regenerate", "--program", "prog_missing")
    assert (
        r.returncode != 0 and r.stderr.strip() == "tally: program_not_found: program prog_missing not found"
    )
