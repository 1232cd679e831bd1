"""Docs that cannot drift: every error code, setting and CLI verb is in the README."""

from __future__ import annotations

import re

import click

from api.cli import cli
from api.settings import Settings
from ingest.domain.errors import ALL_ERRORS
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_readme_shows_the_two_commands() -> None:
    assert "make run" in README and "make test" in README


def test_every_contract_error_code_is_in_the_readme() -> None:
    internal = {"internal_error", "method_not_allowed", "conflict", "service_unavailable"}
    missing = [c.code for c in ALL_ERRORS if c.code not in internal and f"`{c.code}`" not in README]
    assert missing == []


def test_every_setting_is_in_the_readme() -> None:
    names = [f"TALLY_{name.upper()}" for name in Settings.model_fields]
    missing = [name for name in names if name not in README]
    assert missing == []


def test_every_cli_verb_is_in_the_readme() -> None:
    verbs = []
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            verbs += [f"tally {name} {child}" for child in command.list_commands(ctx)]
        else:
            verbs.append(f"tally {name}")
    flat = re.sub(r"\s+", " ", README)
    assert [v for v in verbs if v not in flat] == []
