"""`tally completion bash|zsh|fish`: the script each shell sources, and the completions `tally`
answers when that script asks (commands, options, choices, program ids from the login). Bash is
run for real: it sources the script and asks for completions the way the shell does on Tab."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import OP, ROOT, LiveServer
from tests.test_cli import tally

BIN = str(Path(sys.executable).parent)  # where `tally` is installed (the scripts call it by name)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALLY_", "_TALLY"))}
    return env | {"PATH": f"{BIN}:{env.get('PATH', '')}"} | extra


def _complete(shell: str, words: str, cword: str, home: Path) -> list[str]:
    """What `tally` answers the completion script of `shell` for the command line `words`."""
    env = _env(
        _TALLY_COMPLETE=f"{shell}_complete", COMP_WORDS=words, COMP_CWORD=cword, XDG_CONFIG_HOME=str(home)
    )
    done = subprocess.run(
        [sys.executable, "-m", "api.cli"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_each_shell_gets_its_script(tmp_path: Path) -> None:
    r = tally(tmp_path, "completion", "bash")
    assert r.returncode == 0, r.stderr
    assert "_tally_completion() {" in r.stdout
    assert "_TALLY_COMPLETE=bash_complete $1" in r.stdout
    assert "complete -o nosort -F _tally_completion tally" in r.stdout
    r = tally(tmp_path, "completion", "zsh")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#compdef tally")
    assert "_TALLY_COMPLETE=zsh_complete tally" in r.stdout and "compdef _tally_completion tally" in r.stdout
    r = tally(tmp_path, "completion", "fish")
    assert r.returncode == 0, r.stderr
    assert "function _tally_completion" in r.stdout and "_TALLY_COMPLETE=fish_complete" in r.stdout
    assert 'complete --no-files --command tally --arguments "(_tally_completion)"' in r.stdout
    r = tally(tmp_path, "completion", "powershell")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "fish" in r.stderr


def test_the_completions_each_shell_asks_for(tmp_path: Path) -> None:
    assert _complete("bash", "tally pay", "1", tmp_path) == ["plain,payouts"]
    assert _complete("bash", "tally payouts ", "2", tmp_path) == [
        "plain,cancel",
        "plain,create",
        "plain,export",
        "plain,list",
        "plain,mark-paid",
        "plain,row-failed",
    ]
    assert _complete("bash", "tally partners ", "2", tmp_path) == [
        "plain,adjust",
        "plain,list",
        "plain,show",
        "plain,statement",
    ]
    assert _complete("bash", "tally report finance --format ", "4", tmp_path) == [
        "plain,json",
        "plain,csv",
        "plain,html",
        "plain,xlsx",
    ]
    zsh = _complete("zsh", "tally stripe trigger charge", "3", tmp_path)
    assert zsh == ["plain", "charge.refunded", "_"]
    fish = _complete("fish", "tally auth st", "st", tmp_path)
    assert fish == ["plain,status\twhich server and credential the CLI uses, checked against the server"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_with_the_sourced_script(tmp_path: Path) -> None:
    """bash sources `tally completion bash`, then completes `tally comp<Tab>` and
    `tally migrate --st<Tab>` as it would on a terminal."""
    script = (
        "source <(tally completion bash)\n"
        'for line in "tally comp" "tally migrate --st"; do\n'
        '  read -ra COMP_WORDS <<< "$line"\n'
        "  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n"
        "  _tally_completion tally  # as bash calls it: with the command's name\n"
        '  echo "${COMPREPLY[*]}"; COMPREPLY=()\n'
        "done\n"
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        env=_env(XDG_CONFIG_HOME=str(tmp_path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["completion", "--status"]


def test_program_ids_complete_from_the_login(live_server: LiveServer, tmp_path: Path) -> None:
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "Shop"}, headers=owner
        ).json()["data"]["program_id"]
    assert _complete("bash", "tally explain --program ", "3", tmp_path) == []  # no login: nothing, quietly
    assert tally(tmp_path, "login", "--url", live_server.url, "--token", acct["token"]).returncode == 0
    assert _complete("bash", "tally explain --program ", "3", tmp_path) == [f"plain,{pid}"]
    assert _complete("fish", "tally payouts list --program prog_", "prog_", tmp_path) == [
        f"plain,{pid}\tShop"
    ]
