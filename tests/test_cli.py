"""The CLI's account commands are HTTP clients of a running server (CONTRACT section 10)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import click
import httpx

from api.cli import cli
from tests.conftest import OP, ROOT, LiveServer


def tally(
    home: Path, *args: str, stdin: str | None = None, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env["XDG_CONFIG_HOME"] = str(home)
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        env=env,
        input=stdin,
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
    assert r.returncode == 4 and r.stderr.startswith("tally: unknown account token:")  # an auth failure
    assert len(r.stderr.strip().splitlines()) == 1 and "acct_wrong" not in r.stderr
    r = tally(home, "login", "--url", live_server.url, "--token", "-", stdin=acct["token"] + "\n")
    assert r.returncode == 0, r.stderr
    assert acct["token"] not in r.stdout + r.stderr
    stored = home / "tally" / "credentials.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600

    # `programs create` prints the row `programs list` prints (a table; tab-separated in a pipe)
    r = tally(home, "programs", "create", "--workspace", acct["workspace_id"], "--name", "CLI program")
    assert r.returncode == 0, r.stderr
    [created] = r.stdout.splitlines()
    program_id, workspace, masked, name = created.split("\t")
    assert (workspace, name) == (acct["workspace_id"], "CLI program") and program_id.startswith("prog_")
    assert masked.startswith("aff_\u2022") and "keys regenerate" in r.stderr  # the key: masked, never shown
    r = tally(home, "programs", "list")
    assert r.returncode == 0 and r.stdout.splitlines() == [created]

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


def test_login_takes_the_token_from_the_environment_and_lists_programs_as_json(
    live_server: LiveServer, tmp_path: Path
) -> None:
    acct = httpx.post(
        live_server.url + "/api/v1/operator/accounts",
        json={"email": "e@x.test", "workspace_name": "W"},
        headers=OP,
    ).json()["data"]
    home = tmp_path / "cfg"
    r = tally(home, "login", "--url", live_server.url, stdin="", TALLY_ACCOUNT_TOKEN=acct["token"])
    assert r.returncode == 0, r.stderr
    r = tally(
        home, "programs", "create", "--workspace", acct["workspace_id"], "--name", "JSON program", "--json"
    )
    assert r.returncode == 0, r.stderr
    assert '"api_token_masked"' in r.stdout and 'api_key"' not in r.stdout
    assert json.loads(r.stdout)["name"] == "JSON program"
    r = tally(home, "programs", "list", "--json")
    assert r.returncode == 0, r.stderr
    [program] = json.loads(r.stdout)
    assert program["name"] == "JSON program" and program["workspace_id"] == acct["workspace_id"]
    r = tally(home, "login", "--url", live_server.url, stdin="")
    assert r.returncode == 1 and "TALLY_ACCOUNT_TOKEN" in r.stderr


def test_version_and_usage_errors_are_one_line(tmp_path: Path) -> None:
    r = tally(tmp_path, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tally {metadata.version('tally')}"
    r = tally(tmp_path, "report", "finance", "--program", "p", "--format", "pdf", "-o", "-")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "pdf" in r.stderr


def _commands(command: click.Command, path: str = "tally") -> list[tuple[str, click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            child = command.get_command(ctx, name)
            assert child is not None, name
            found += _commands(child, f"{path} {name}")
    return found


def test_every_option_has_a_description_and_every_command_an_example() -> None:
    """The CLI follows its own help: walked over the whole command tree, so a command or an
    option added later without them fails here."""
    commands = _commands(cli)
    assert len(commands) > 12
    missing_examples = [path for path, c in commands if not (c.epilog or "").startswith("\b\nexample")]
    missing_help = [
        f"{path} {'/'.join(p.opts)}"
        for path, c in commands
        for p in c.params
        if isinstance(p, click.Option) and not p.help
    ]
    missing_summary = [path for path, c in commands if not (c.short_help or c.help)]
    leaves = [path for path, c in commands if not isinstance(c, click.Group)]
    assert {"tally migrate", "tally backup", "tally report finance", "tally serve"} <= set(leaves)
    assert {"tally auth status", "tally logout", "tally completion", "tally stripe trigger"} <= set(leaves)
    assert missing_examples == [] and missing_help == [] and missing_summary == []
