"""Settings are read once, typed, and `tally serve` refuses to start without what it needs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from api.settings import SettingsError, load_settings
from tests.conftest import ROOT


def test_missing_operator_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TALLY_OPERATOR_TOKEN", raising=False)
    with pytest.raises(SettingsError, match="TALLY_OPERATOR_TOKEN"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TALLY_STRIPE_TOLERANCE_SECONDS", "soon"),
        ("TALLY_BASE_URL", "ftp://x"),
        ("TALLY_RECONCILE_INTERVAL_SECONDS", "-1"),
        ("TALLY_OPERATOR_TOKEN", "short"),
    ],
)
def test_malformed_settings_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv("TALLY_OPERATOR_TOKEN", "x" * 20)
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        load_settings()


def test_secrets_are_masked_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALLY_OPERATOR_TOKEN", "super-secret-operator-token")
    monkeypatch.setenv("TALLY_STRIPE_WEBHOOK_SECRETS", "whsec_a, whsec_b")
    settings = load_settings()
    assert "super-secret" not in repr(settings) and "whsec_a" not in repr(settings)
    assert settings.webhook_secrets() == ["whsec_a", "whsec_b"]


def test_serve_refuses_to_start_with_one_line_reason() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "serve", "--port", "1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TALLY_OPERATOR_TOKEN" in lines[0]
