"""Every dependency in pyproject.toml is used and justified: the README's "Dependencies" section has
one line for each (and none for anything else), and each is imported by tally's code or tests,
unless it is one of the few used otherwise, whose use is checked here too."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from api.routes import reference
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CODE = ("api", "ingest", "reconcile", "reports", "sdk", "tests", "bench")


def declared() -> set[str]:
    lines = PYPROJECT["project"]["dependencies"] + PYPROJECT["dependency-groups"]["dev"]
    return {canonicalize_name(Requirement(line).name) for line in lines}


def readme_lines() -> dict[str, str]:
    """The README's "Dependencies" section: its `- `name`: why` lines, by canonical name."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Dependencies\n", 1)[1].split("\n## ", 1)[0]
    lines: dict[str, str] = {}
    for match in re.finditer(r"^- `([^`]+)`: (.+)$", section, re.MULTILINE):
        name = canonicalize_name(Requirement(match.group(1)).name)
        assert name not in lines, f"{name} has two lines in the README"
        lines[name] = match.group(2)
    return lines


def imported(root: Path = ROOT, folders: tuple[str, ...] = CODE) -> set[str]:
    """Top-level modules imported anywhere in tally's code, tests and benchmarks."""
    names: set[str] = set()
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def blocked_import_fails(blocked: str, code: str) -> bool:
    """Whether `code` fails in a fresh interpreter where `blocked` cannot be imported."""
    program = (
        f"import sys, warnings\nwarnings.simplefilter('error')\nsys.modules[{blocked!r}] = None\n{code}\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    return done.returncode != 0 and blocked in done.stderr


def makefile_runs(fragment: str) -> bool:
    return fragment in (ROOT / "Makefile").read_text()


HTTPCORE_SYNC = "httpcore._synchronization"

# Declared, never imported by tally, and needed all the same: how each is used, checked.
USED_OTHERWISE: dict[str, Callable[[], bool]] = {
    # httpcore imports sniffio on every request; without it, each import fails after a search of
    # sys.path (13 % of the webhook sender's CPU): the reason holds while httpcore still does it
    "sniffio": lambda: (
        "import sniffio" in inspect.getsource(importlib.import_module("httpcore._synchronization"))
    ),
    # DuckDB's client imports pytz to hand back TIMESTAMPTZ values (the tracking log, reconcile reads)
    "pytz": lambda: blocked_import_fails(
        "pytz", "import duckdb; duckdb.sql(\"SELECT TIMESTAMPTZ '2026-11-21 10:00:00+00'\").fetchall()"
    ),
    # Starlette's TestClient runs on httpx2; with httpx alone it warns (an error in this suite)
    "httpx2": lambda: blocked_import_fails("httpx2", "import starlette.testclient"),
    # Swagger UI's files, served by GET /docs; the package's Python code is never imported
    "swagger-ui-py": lambda: all(path.is_file() for path, _ in reference.ASSETS.values()),
    "pytest-timeout": lambda: "timeout" in PYPROJECT["tool"]["pytest"]["ini_options"],
    "pytest-xdist": lambda: makefile_runs("$(BIN)/pytest -n "),
    "ruff": lambda: makefile_runs("$(BIN)/ruff check"),
    "mypy": lambda: makefile_runs("$(BIN)/mypy"),
    # a binary: bench/harness.py runs `py-spy dump` to name the server's threads
    "py-spy": lambda: '"py-spy"' in (ROOT / "bench" / "harness.py").read_text(),
}


def test_each_dependency_has_one_readme_line_and_each_line_a_dependency() -> None:
    lines = readme_lines()
    assert sorted(declared() - set(lines)) == [], "declared without a line in README's Dependencies"
    assert sorted(set(lines) - declared()) == [], "README lines for dependencies no longer declared"
    assert all(len(why.split()) >= 3 for why in lines.values()), "each line says why"


def test_each_dependency_is_imported_or_used_otherwise() -> None:
    modules = imported()
    unused = sorted(
        name for name in declared() - set(USED_OTHERWISE) if name.replace("-", "_") not in modules
    )
    assert unused == [], "nothing imports these: remove them (uv remove) or say how they are used"
    not_used = sorted(name for name, used in USED_OTHERWISE.items() if not used())
    assert not_used == [], "listed as used otherwise, but that use is gone"
    assert set(USED_OTHERWISE) <= declared()


def test_the_checks_catch_what_they_must(tmp_path: Path) -> None:
    assert not blocked_import_fails("pytz", "import json")
    assert blocked_import_fails("pytz", "import pytz")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "m.py").write_text(
        "import sqlalchemy.orm\nfrom rich.table import Table\nfrom . import x\n"
    )
    assert imported(tmp_path, ("pkg",)) == {"sqlalchemy", "rich"}
    assert "sqlalchemy" not in imported() and "sqlalchemy" not in declared()
