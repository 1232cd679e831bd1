"""The benches' servers (bench/harness.py `tally_process`, bench/slowclients.py `server`): each
answers on the URL it gives, and its database folder goes with it (a bench run starts dozens of
servers, of about 65 MB each, and used to leave them all in the temp folder)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx

from bench import slowclients
from bench.harness import tally_process


def _databases() -> set[Path]:
    """The folders the two servers make (`tempfile.mkdtemp`'s names: the prefix, 8 characters)."""
    return {p for p in Path(tempfile.gettempdir()).glob("tally-bench-????????") if p.is_dir()}


def test_a_bench_server_answers_and_leaves_no_database_behind() -> None:
    before = _databases()
    with tally_process() as served:
        assert httpx.get(served.url + "/healthz", timeout=30).status_code == 200
        made = _databases() - before  # its database, while it runs
    assert made and not any(path.exists() for path in made)
    with slowclients.server() as url:
        assert isinstance(url, str)
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200
        made = _databases() - before
    assert made and not any(path.exists() for path in made)
