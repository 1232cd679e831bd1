"""bench/harness.py `gil_sampled`: who holds the interpreter lock, sampled with py-spy, is what
bench/ingest, bench/webhook and bench/pgingest turn into the lock's microseconds a request (and the most one
lock can serve). Checked on processes whose share is known: a thread spinning in Python holds
it nearly all the time, a process asleep never."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bench.harness import GilShare, gil_sampled

SPIN = """
import threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, name="spinner", daemon=True).start()
time.sleep(60)
"""


@contextmanager
def _python(code: str) -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)  # started, its threads running
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _share(code: str) -> GilShare:
    with _python(code) as pid, gil_sampled(pid, 2) as shares:
        time.sleep(2.2)
    assert len(shares) == 1
    return shares[0]


def test_a_spinning_thread_holds_the_lock_and_is_named() -> None:
    share = _share(SPIN)
    assert share.instants > 100
    # (py-spy may fall behind its rate on a loaded machine: the share is then understated)
    assert share.held >= 0.5 * share.instants
    assert max(share.by_thread, key=share.by_thread.__getitem__) == "spinner"
    figures = share.per_request(2.0, 1000)  # 2 s for 1,000 requests: at most 2,000 us each
    assert figures["gil_us_per_request"] == round(share.held * 2.0 / share.instants / 1000 * 1e6, 1)
    assert 1000 <= figures["gil_us_per_request"] <= 2000
    assert set(figures["gil_us_per_request_by_thread"]) == set(share.by_thread)
    assert sum(figures["gil_us_per_request_by_thread"].values()) == pytest.approx(
        figures["gil_us_per_request"], abs=0.5
    )


def test_a_sleeping_process_holds_it_never() -> None:
    share = _share("import time; time.sleep(60)")
    assert share.instants > 100
    assert share.held == 0
    assert share.per_request(2.0, 1000)["gil_us_per_request"] == 0.0


def test_a_process_that_cannot_be_sampled_gives_no_figure() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # gone: py-spy cannot attach
    with gil_sampled(proc.pid, 1) as shares:
        pass
    assert shares == []
