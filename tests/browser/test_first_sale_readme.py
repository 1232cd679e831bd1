"""The README's "First sale in five minutes", run as it stands (issue: the first hour).

The section's `sh` blocks are taken from README.md itself, so the walkthrough and the product
cannot drift: the first block must be `make run`, which this test runs (on a spare port and a
data directory of its own); every later block goes, in order, to one bash session, as a user
types them into a second terminal; the block that prints the demo shop's link is followed by the
browser step the README describes (open the link in Chromium, press Sign up); each `text` block
after an `sh` block is its output as run, `…` standing for what differs between runs (ids,
counts, times), and must appear in that block's output line by line, in order. At the end the
dashboard's sales page, signed in with the walkthrough's account token, lists the three sales,
each attributed to alice.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.browser.cdp import Page
from tests.browser.measure import log_in
from tests.conftest import free_port
from tests.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## First sale in five minutes"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
DEFAULT_URL = "http://127.0.0.1:8000"
CLICK_STATUS = "document.getElementById('click-status')"
LEAD_STATUS = "document.getElementById('lead-status')"
SALE_ROWS = "[...document.querySelectorAll('#sales tbody tr')].map(r => r.textContent.replace(/\\s+/g, ' '))"


@dataclass
class Step:
    command: str
    output: list[str]  # the expected lines, `…` for what differs between runs


def walkthrough() -> list[Step]:
    """The section's `sh` blocks, each with the `text` block that follows it (if any)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(SECTION)
    end = readme.index("\n## ", start + len(SECTION))
    steps: list[Step] = []
    for match in BLOCK.finditer(readme[start:end]):
        kind, body = match.group(1), match.group(2)
        if kind == "sh":
            steps.append(Step(body, []))
        elif kind == "text":
            assert steps and not steps[-1].output, "a text block follows an sh block"
            steps[-1].output = body.splitlines()
    return steps


def matches(expected: list[str], output: str) -> bool:
    """Whether each expected line (with `…` as a wildcard) appears in `output`, in order."""
    lines = output.splitlines()
    at = 0
    for want in expected:
        if want.strip() == "…":
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in want.split("…")) + r"\Z")
        while at < len(lines) and not pattern.fullmatch(lines[at].rstrip()):
            at += 1
        if at == len(lines):
            return False
        at += 1
    return True


class Shell:
    """One bash session fed block by block, as a user types into a terminal."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.run("set -eo pipefail")  # a failing command ends the session: the test sees it

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, command: str, seconds: float = 120) -> str:
        assert self.process.stdin is not None
        done = f"__done_{uuid.uuid4().hex}__"
        self.process.stdin.write(f"{command}\necho {done}\n")
        self.process.stdin.flush()
        out: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=seconds)
            except queue.Empty:
                pytest.fail(f"no end of {command!r} within {seconds} s; output so far:\n{''.join(out)}")
            if line is None:
                code = self.process.wait()
                pytest.fail(f"the shell exited ({code}) in:\n{command}\noutput:\n{''.join(out)}")
            if line.rstrip().endswith(done):  # after output that did not end its line (curl's)
                out.append(line.rstrip()[: -len(done)])
                return "".join(out)
            out.append(line)

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=20)
        while self.lines.get(timeout=20) is not None:  # the reader has seen the end
            pass
        self.process.stdout.close()


def _environment(home: Path) -> dict[str, str]:
    """A new user's terminal: none of the test run's TALLY_* settings, a HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALLY_", "SERVICE_API_KEY"))}
    env["HOME"] = str(home)
    return env


def _browser_step(page: Page, url: str) -> None:
    """What the README asks of the reader: open the link, wait for the click, press Sign up."""
    page.navigate(url)
    state = page.wait_until(f"(s => s !== 'waiting' && s)({CLICK_STATUS}.dataset.state)")
    click = page.evaluate(f"{CLICK_STATUS}.textContent")
    assert state == "recorded" and "recorded for partner alice" in click, click
    page.evaluate("document.getElementById('signup-button').click()")
    lead = page.wait_until(f"(s => s !== 'sending' && s)({LEAD_STATUS}.dataset.state)")
    status = page.evaluate(f"{LEAD_STATUS}.textContent")
    assert lead == "recorded" and "demo_user_1" in status and "with the click" in status, status


@pytest.mark.browser
def test_the_readme_first_sale_walkthrough_runs_as_written(tmp_path: Path, page: Page) -> None:
    steps = walkthrough()
    assert [s.command.strip() for s in steps[:1]] == ["make run"], "the walkthrough starts with make run"
    assert len(steps) >= 6, "the section's blocks were found"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    env = _environment(tmp_path / "home")
    (tmp_path / "home").mkdir()
    terminal_1 = (tmp_path / "make-run.log").open("wb")
    server = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"PORT={port}", f"DATA={data}"],
        cwd=ROOT,
        env=env,
        stdout=terminal_1,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    shell = Shell(ROOT, env)
    try:
        wait_until(lambda: _ready(url), "make run answers on its port", seconds=120)
        for step in steps[1:]:
            command = step.command.replace(DEFAULT_URL, url).replace("data/", f"{data}/")
            out = shell.run(command)
            expected = [line.replace(DEFAULT_URL, url) for line in step.output]
            assert matches(expected, out), f"{step.command}\nexpected:\n{step.output}\ngot:\n{out}"
            if "/demo/shop?" in step.command:
                link = out.strip().splitlines()[-1]
                assert link.startswith(f"{url}/demo/shop?program_id=prog_") and link.endswith("&aff=alice")
                _browser_step(page, link)
        token = shell.run('echo "$TALLY_ACCOUNT_TOKEN"').strip()
        sales_page = shell.run('echo "$TALLY_URL/dashboard/programs/$PROGRAM/sales"').strip()
        assert token.startswith("acct_") and sales_page.startswith(f"{url}/dashboard/programs/prog_")
        log_in(page, url, token)
        page.navigate(sales_page)
        rows = page.evaluate(SALE_ROWS)
        assert len(rows) == 3, rows
        for transaction in ("in_1001", "in_1002", "pi_"):
            assert any(transaction in row and "alice" in row for row in rows), (transaction, rows)
    finally:
        shell.close()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        terminal_1.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
