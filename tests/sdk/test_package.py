"""tally-sdk as a distribution of its own: it imports only httpx and the standard library, states
its one version in its README and `User-Agent`, and its typed response data (`tally_sdk.responses`)
has exactly the keys and value types the real app answers with."""

from __future__ import annotations

import ast
import re
import sys
from typing import Any

import httpx
import pytest

import tally_sdk
from tally_sdk import LeadData, RefundData, SaleData, SaleTestModeData, Tally, TrackResult
from tally_sdk.responses import ApiWarning
from tests.conftest import ROOT, World
from tests.sdk.helpers import APP_URL, RealApp, check_shape, settled_lead

SDK = ROOT / "sdk"
ALLOWED_IMPORTS = {"httpx", "tally_sdk"}  # and the standard library


def imported_modules(source: str) -> set[str]:
    """The top-level names of every module `source` imports (relative imports excluded)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_sdk_imports_only_httpx_and_the_standard_library() -> None:
    modules = sorted((SDK / "tally_sdk").glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "client.py", "responses.py", "_version.py"}
    foreign = {
        f"{path.name}: {name}"
        for path in modules
        for name in imported_modules(path.read_text())
        if name not in ALLOWED_IMPORTS and name not in sys.stdlib_module_names and name != "__future__"
    }
    assert foreign == set(), "tally-sdk depends on httpx alone (no pydantic, no server packages)"
    assert (SDK / "tally_sdk" / "py.typed").is_file()


def test_the_import_check_sees_what_it_must() -> None:
    source = "import pydantic\nfrom api.app import create_app\nfrom . import x\nimport os.path\n"
    assert imported_modules(source) == {"pydantic", "api", "os"}


def test_one_version_in_the_package_readme_metadata_and_user_agent(world: World) -> None:
    version = tally_sdk.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", version)
    readme = (SDK / "README.md").read_text()
    assert re.search(rf"^Version: `{re.escape(version)}`$", readme, re.MULTILINE)
    mentioned = set(re.findall(r"(?<![\d.])\d+\.\d+\.\d+(?![\d.])", readme))
    assert mentioned == {version}, "every version sdk/README.md mentions is tally_sdk/_version.py's"
    pyproject = (SDK / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'path = "tally_sdk/_version.py"' in pyproject
    assert re.search(r'^dependencies = \["httpx>=[0-9.]+"\]$', pyproject, re.MULTILINE)
    app = RealApp(world)
    with Tally(base_url=APP_URL, api_key=world.api_key, transport=httpx.MockTransport(app)) as tally:
        tally.track_lead(customer_external_id="user_ua")
    assert app.requests[0].headers["user-agent"] == f"tally-python/{version}"


# -- typed response data against the real app ---------------------------------------------------
def check_result(result: TrackResult[Any], typed: Any) -> None:
    check_shape(result.data, typed)
    for warning in result.warnings:
        check_shape(warning, ApiWarning)


def test_the_typed_data_is_what_the_real_app_answers(world: World) -> None:
    click_id = settled_lead(world, "user_41")
    with Tally(
        base_url=APP_URL, api_key=world.api_key, transport=httpx.MockTransport(RealApp(world))
    ) as tally:
        check_result(tally.track_lead(customer_external_id="user_42", click_id=click_id), LeadData)
        check_result(tally.track_lead(customer_external_id="user_43", email="u@x.test"), LeadData)
        attributed = tally.track_sale(customer_external_id="user_41", amount=4900, invoice_id="in_1")
        assert attributed.data["partner_code"] == "alice"
        unattributed = tally.track_sale(customer_external_id="nobody", amount=100, invoice_id="in_2")
        assert unattributed.data["partner_code"] is None
        assert [w["code"] for w in unattributed.warnings] == ["customer_not_attributed"]
        for sale in (attributed, unattributed):
            check_result(sale, SaleData)
        check_result(tally.track_test_sale(), SaleTestModeData)
        check_result(tally.track_refund(transaction_id="in_1", refund_id="re_1", amount=900), RefundData)
        unknown = tally.track_refund(transaction_id="in_404", refund_id="re_2", amount=1)
        assert unknown.data["sale_found"] is False
        check_result(unknown, RefundData)


@pytest.mark.parametrize(
    ("data", "typed"),
    [
        ({"lead_id": "l", "customer_external_id": "c", "status": "pending", "provisional": False}, LeadData),
        ({"lead_id": "l", "customer_external_id": "c", "status": "settled"}, LeadData),
        ({"refund_id": "r", "transaction_id": "t", "amount": True, "sale_found": True}, RefundData),
        ({"sale_id": "s", "transaction_id": None, "test_mode": True, "extra": 1}, SaleTestModeData),
        ({"code": 1}, ApiWarning),
    ],
)
def test_the_shape_check_refuses_what_the_types_do_not_say(data: dict[str, Any], typed: Any) -> None:
    with pytest.raises(AssertionError):
        check_shape(data, typed)
