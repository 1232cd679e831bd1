"""Which credential the CLI sends, and what it says when there is none or the server refuses it:
`tally auth status`, `tally logout`, TALLY_ACCOUNT_TOKEN and TALLY_URL without a login (like gh's
GH_TOKEN), exit code 4 for every authentication failure. Against a live server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.conftest import OP, OPERATOR_TOKEN, LiveServer
from tests.test_cli import tally

AUTH = 4  # the exit code of an authentication failure


def _account(url: str, email: str = "o@x.test") -> dict[str, str]:
    with httpx.Client(base_url=url, timeout=30) as c:
        acct: dict[str, str] = c.post(
            "/api/v1/operator/accounts", json={"email": email, "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        program = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=owner
        )
        acct["program_id"] = program.json()["data"]["program_id"]
        member = c.post(
            f"/api/v1/workspaces/{acct['workspace_id']}/members",
            json={"email": "m@x.test", "role": "member"},
            headers=owner,
        )
        acct["member_token"] = member.json()["data"]["token"]
    return acct


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_auth_status_and_logout_with_the_stored_login(live_server: LiveServer, tmp_path: Path) -> None:
    url = live_server.url
    acct = _account(url)
    home = tmp_path / "cfg"

    r = tally(home, "auth", "status")
    assert r.returncode == AUTH and _one_line(r.stderr).startswith("tally: not logged in:") and r.stdout == ""
    r = tally(home, "programs", "list")
    assert r.returncode == AUTH and "TALLY_ACCOUNT_TOKEN" in _one_line(r.stderr)

    assert tally(home, "login", "--url", url, "--token", "-", stdin=acct["token"]).returncode == 0
    stored = home / "tally" / "credentials.json"
    r = tally(home, "auth", "status")
    assert r.returncode == 0, r.stderr
    where, account, operator = r.stdout.splitlines()
    assert where == f"{url} (from the stored login)"
    assert f"acct_****{acct['token'][-4:]} (from {stored})" in account
    assert account.endswith("valid: 1 program(s) in 1 workspace(s)") and acct["token"] not in r.stdout
    assert operator == "  operator token: not set (TALLY_OPERATOR_TOKEN)"

    r = tally(home, "auth", "status", "--json", TALLY_OPERATOR_TOKEN=OPERATOR_TOKEN)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "url": url,
        "url_source": "the stored login",
        "account": {
            "token": f"acct_****{acct['token'][-4:]}",
            "source": str(stored),
            "valid": True,
            "programs": 1,
            "workspaces": 1,
        },
        "operator": {"set": True, "valid": True},
    }
    r = tally(home, "auth", "status", TALLY_OPERATOR_TOKEN="not-the-operator-token-0123456789")
    assert r.returncode == AUTH and "refused (operator_token_required)" in r.stdout
    assert _one_line(r.stderr) == f"tally: {url} refuses TALLY_OPERATOR_TOKEN"

    # the stored token goes only to its own server: another TALLY_URL needs a token of its own
    r = tally(home, "programs", "list", TALLY_URL="http://127.0.0.1:9")
    assert r.returncode == AUTH and "not logged in to http://127.0.0.1:9" in _one_line(r.stderr)

    r = tally(home, "logout")
    assert r.returncode == 0 and r.stdout.strip() == f"logged out of {url}: removed {stored}"
    assert not stored.exists()
    r = tally(home, "programs", "list")
    assert r.returncode == AUTH and "not logged in" in r.stderr
    r = tally(home, "logout", TALLY_ACCOUNT_TOKEN=acct["token"])
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"not logged in: no stored login ({stored})",
        "TALLY_ACCOUNT_TOKEN is still set: account commands keep using it",
    ]


def test_the_environment_token_works_for_every_account_command_without_a_login(
    live_server: LiveServer, tmp_path: Path
) -> None:
    """TALLY_ACCOUNT_TOKEN with TALLY_URL: no `tally login`, nothing stored; a JSON read, a
    report download (a file, not JSON) and an owner's act all go through; a refused token or a
    member's token on an owner's act exit 4 with the server's code."""
    url = live_server.url
    acct = _account(url)
    home = tmp_path / "cfg"
    env = {"TALLY_ACCOUNT_TOKEN": acct["token"], "TALLY_URL": url}

    r = tally(home, "programs", "list", "--json", **env)
    assert r.returncode == 0, r.stderr
    assert [p["program_id"] for p in json.loads(r.stdout)] == [acct["program_id"]]
    report = ("report", "double-counting", "--program", acct["program_id"], "-o", "-")
    r = tally(home, *report, **env)
    assert r.returncode == 0 and json.loads(r.stdout)["data"] is not None, r.stderr
    r = tally(home, "keys", "regenerate", "--program", acct["program_id"], "--json", **env)
    assert r.returncode == 0 and json.loads(r.stdout)["api_key"].startswith("aff_"), r.stderr
    r = tally(home, "auth", "status", **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [
        f"{url} (from TALLY_URL)",
        f"  account token acct_****{acct['token'][-4:]} (from TALLY_ACCOUNT_TOKEN): "
        "valid: 1 program(s) in 1 workspace(s)",
    ]
    assert not (home / "tally").exists()  # nothing stored

    # the environment's token wins over a stored login, and goes to the login's server
    assert tally(home, "login", "--url", url, "--token", acct["member_token"]).returncode == 0
    r = tally(home, "keys", "regenerate", "--program", acct["program_id"], TALLY_ACCOUNT_TOKEN=acct["token"])
    assert r.returncode == 0, r.stderr
    # the stored member's token: 403 owner_required, an authentication failure
    r = tally(home, "keys", "regenerate", "--program", acct["program_id"])
    assert r.returncode == AUTH and _one_line(r.stderr).startswith("tally: owner_required:")

    wrong = {"TALLY_ACCOUNT_TOKEN": "acct_" + "x" * 40, "TALLY_URL": url}
    r = tally(home, "programs", "list", **wrong)
    assert r.returncode == AUTH and _one_line(r.stderr).startswith("tally: account_token_required:")
    r = tally(home, *report, **wrong)
    assert r.returncode == AUTH and r.stdout == ""
    r = tally(home, "auth", "status", **wrong)
    assert r.returncode == AUTH and "refused (account_token_required)" in r.stdout
    assert "refuses the account token from TALLY_ACCOUNT_TOKEN" in _one_line(r.stderr)
    r = tally(home, "programs", "list", TALLY_ACCOUNT_TOKEN=acct["token"], TALLY_URL="ftp://x")
    assert r.returncode == 1 and "TALLY_URL must start with http://" in _one_line(r.stderr)
