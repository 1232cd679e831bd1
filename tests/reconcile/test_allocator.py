"""Polars' allocator decay is set by the `tally` command before Polars loads, and wins over
Polars' own default (reconcile/allocator.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reconcile import allocator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_the_setting_comes_after_polars_defaults_so_it_wins() -> None:
    conf = _python(
        "import os\nfrom reconcile import allocator\nassert allocator.tune()\n"
        "import polars\nprint(os.environ['_RJEM_MALLOC_CONF'])"
    )
    options = [item.split(":", 1)[0] for item in conf.split(",")]
    assert conf.endswith(allocator.POLARS_JEMALLOC)
    assert options.count("dirty_decay_ms") == 2  # Polars' default first, then ours (last wins)


def test_the_tally_command_sets_it_before_running_a_command() -> None:
    conf = _python(
        "import os, sys\nfrom api.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('polars' in sys.modules, os.environ.get('_RJEM_MALLOC_CONF'))"
    )
    assert conf.endswith(f"False {allocator.POLARS_JEMALLOC}")


def test_too_late_once_polars_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import polars  # noqa: F401  (loaded by the test run already)

    monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    assert allocator.tune() is False
    assert "_RJEM_MALLOC_CONF" not in os.environ
