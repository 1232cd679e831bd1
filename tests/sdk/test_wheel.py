"""The SDK's wheel as a brand server gets it: built with the pinned uv from sdk/, installed into a fresh
virtualenv (httpx from PyPI, at the version this suite runs), imported there with nothing of the
server around, type-checked through its `py.typed`, and run against a real `tally serve` process.
The server's own wheel still builds, without the SDK in it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import tally_sdk
from tests.conftest import ROOT, LiveServer, World, make_world

pytestmark = pytest.mark.slow

UV = ROOT / ".tools" / "bin" / "uv"
SERVER_PACKAGES = {"api", "ingest", "reconcile", "reports"}
FORBIDDEN = {"starlette", "duckdb", "pydantic", "polars", "pyarrow", "uvicorn", "tally"}
TIMEOUT = 600  # generous: a cold uv cache downloads hatchling and httpx's wheels


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, status: int = 0) -> str:
    """Run a command; its exit status must be `status`; returns its standard output."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == status, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put this repository or its venv in reach."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "MYPYPATH"}
    return {**{k: v for k, v in os.environ.items() if k not in dropped}, **extra}


def requirement_closure(name: str) -> set[str]:
    """`name` and everything it needs (no extras), by the metadata installed in this environment."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = canonicalize_name(todo.pop())
        if current in seen:
            continue
        seen.add(current)
        for line in importlib.metadata.requires(current) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    work: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    assert UV.is_file(), "the pinned uv is missing: run `make setup`"
    work = tmp_path_factory.mktemp("sdk_wheel")
    env = clean_env()
    run(UV, "build", ROOT / "sdk", "--wheel", "--out-dir", work / "dist", cwd=work, env=env)
    (wheel,) = (work / "dist").glob("*.whl")
    run(UV, "venv", "--quiet", "--python", sys.executable, work / "venv", cwd=work, env=env)
    python = work / "venv" / "bin" / "python"
    # httpx and its own dependencies at the versions this suite runs with (PyPI serves them)
    constraints = work / "constraints.txt"
    pins = sorted(f"{n}=={importlib.metadata.version(n)}" for n in requirement_closure("httpx"))
    constraints.write_text("\n".join(pins) + "\n")
    run(UV, "pip", "install", "--quiet", "--python", python, "-c", constraints, wheel, cwd=work, env=env)
    return Installed(wheel, python, work)


def venv_python(installed: Installed, code: str, **env: str) -> str:
    """Run `code` in the fresh venv, isolated (-I: no cwd, no PYTHON* variables on the path)."""
    return run(installed.python, "-I", "-c", code, cwd=installed.work, env=clean_env(**env))


def test_the_wheel_holds_the_package_its_marker_and_httpx_as_its_only_requirement(
    installed: Installed,
) -> None:
    version = tally_sdk.__version__
    assert installed.wheel.name == f"tally_sdk-{version}-py3-none-any.whl"
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"tally_sdk-{version}.dist-info/METADATA").decode()
    assert "tally_sdk/py.typed" in names
    assert {n.split("/")[0] for n in names} == {"tally_sdk", f"tally_sdk-{version}.dist-info"}
    assert {"tally_sdk/__init__.py", "tally_sdk/client.py", "tally_sdk/responses.py"} <= set(names)
    headers = [line.split(": ", 1) for line in metadata.split("\n\n")[0].splitlines() if ": " in line]
    assert ["Name", "tally-sdk"] in headers and ["Version", version] in headers
    assert [value for key, value in headers if key == "Requires-Dist"] == ["httpx>=0.27"]


def test_a_fresh_venv_gets_httpx_and_its_dependencies_and_nothing_else(installed: Installed) -> None:
    listing = venv_python(
        installed,
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps(sorted(d.metadata['Name'] for d in m.distributions())))\n",
    )
    names = {canonicalize_name(n) for n in json.loads(listing)}
    assert names == {"tally-sdk"} | requirement_closure("httpx")
    assert names.isdisjoint(FORBIDDEN)
    probe = venv_python(
        installed,
        "import importlib.util, json, tally_sdk\n"
        f"found = [m for m in {sorted(SERVER_PACKAGES | FORBIDDEN)!r} if importlib.util.find_spec(m)]\n"
        "print(json.dumps([tally_sdk.__version__, tally_sdk.__file__, found]))\n",
    )
    version, where, found = json.loads(probe)
    assert version == tally_sdk.__version__
    assert Path(where).is_relative_to(installed.work / "venv"), "imported from the wheel, not the tree"
    assert found == [], "nothing of the server can be imported next to the SDK"


GOOD = """\
from tally_sdk import CommissionRow, LeadData, SaleData, Tally, TrackResult


def track(tally: Tally) -> tuple[str, bool, str]:
    lead: TrackResult[LeadData] = tally.track_lead(customer_external_id="user_1", timeout=2.0)
    sale = tally.track_sale(customer_external_id="user_1", amount=4900, invoice_id="in_1")
    data: SaleData = sale.data
    return lead.data["status"], data["attributed"], data["sale_id"]


def owed(tally: Tally) -> int:
    lines: list[CommissionRow] = list(tally.list_commissions("prog_1", period="2026-01"))
    return sum(line["amount"] for line in lines if line["status"] == "approved")
"""
BAD = """\
from tally_sdk import Tally


def track(tally: Tally) -> int:
    sale = tally.track_sale(customer_external_id="user_1", amount=4900, invoice_id="in_1")
    return sale.data["sale_id"]


def first_code(tally: Tally) -> int:
    return next(iter(tally.list_partners("prog_1")))["code"]
"""


def test_the_installed_types_reach_a_type_checker_through_py_typed(installed: Installed) -> None:
    """mypy --strict, told to use the fresh venv's interpreter, checks a brand's code against the
    installed wheel: clean code passes, and a wrong type read from `data` is caught."""
    code = installed.work / "brand"
    code.mkdir()
    (code / "good.py").write_text(GOOD)
    (code / "bad.py").write_text(BAD)
    mypy = [Path(sys.executable).with_name("mypy"), "--strict", "--config-file=", "--no-incremental"]
    mypy += ["--python-executable", installed.python]
    env = clean_env()
    run(*mypy, "good.py", cwd=code, env=env)
    out = run(*mypy, "bad.py", cwd=code, env=env, status=1)
    errors = [line for line in out.splitlines() if ": error: " in line]
    assert errors == [
        'bad.py:6: error: Incompatible return value type (got "str", expected "int")  [return-value]',
        'bad.py:10: error: Incompatible return value type (got "str", expected "int")  [return-value]',
    ]


SCRIPT = """\
import json, warnings
from tally_sdk import Tally

warnings.simplefilter("error")  # a rotation warning or any other would fail the script
with Tally() as tally:  # SERVICE_API_KEY, TALLY_ACCOUNT_TOKEN and TALLY_BASE_URL from the environment
    lead = tally.track_lead(customer_external_id="user_wheel", click_id=CLICK_ID)
    sale = tally.track_sale(customer_external_id="user_wheel", amount=4900, invoice_id="in_wheel_1")
    partners = [p["code"] for p in tally.list_partners(PROGRAM_ID)]
ids = [lead.request_id, sale.request_id]
print(json.dumps({"lead": lead.data, "sale": sale.data, "ids": ids, "partners": partners}))
"""


@pytest.fixture
def live_world(live_server: LiveServer) -> Iterator[World]:
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        yield make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient


def test_the_installed_wheel_tracks_a_lead_and_a_sale_against_a_live_server(
    installed: Installed, live_server: LiveServer, live_world: World
) -> None:
    r = live_world.client.post(
        "/api/v1/track/click", json={"program_id": live_world.program_id, "partner_code": "alice"}
    )
    assert r.status_code == 201, r.text
    click_id = r.json()["data"]["click_id"]
    script = SCRIPT.replace("CLICK_ID", json.dumps(click_id)).replace(
        "PROGRAM_ID", json.dumps(live_world.program_id)
    )
    out = venv_python(
        installed,
        script,
        SERVICE_API_KEY=live_world.api_key,
        TALLY_ACCOUNT_TOKEN=live_world.account_token,
        TALLY_BASE_URL=live_server.url,
    )
    result = json.loads(out)
    assert result["partners"] == ["alice"]  # a read, with the account token
    assert result["lead"] == {
        "lead_id": result["lead"]["lead_id"],
        "customer_external_id": "user_wheel",
        "status": "settled",
        "provisional": False,
    }
    assert result["sale"] == {
        "sale_id": result["sale"]["sale_id"],
        "transaction_id": "in_wheel_1",
        "test_mode": False,
        "attributed": True,
        "partner_code": "alice",
        "customer_external_id": "user_wheel",
        "amount": 4900,
        "currency": "usd",
    }
    # the server recorded both, under the request ids the installed SDK sent
    r = live_world.client.get(
        f"/api/v1/programs/{live_world.program_id}/tracking-log", headers=live_world.owner
    )
    assert r.status_code == 200, r.text
    logged = {e["request_id"]: (e["endpoint"], e["status"]) for e in r.json()["data"]["entries"]}
    lead_id, sale_id = result["ids"]
    assert (logged[lead_id][1], logged[sale_id][1]) == (200, 200)
    assert "lead" in logged[lead_id][0] and "sale" in logged[sale_id][0]


def test_the_server_wheel_still_builds_without_the_sdk(tmp_path: Path) -> None:
    run(UV, "build", ROOT, "--wheel", "--out-dir", tmp_path, cwd=tmp_path, env=clean_env())
    (wheel,) = tmp_path.glob("tally-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {n.split("/")[0] for n in archive.namelist() if not n.startswith("tally-")}
    assert tops == SERVER_PACKAGES
