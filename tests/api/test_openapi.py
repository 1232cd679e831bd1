"""`GET /openapi.json`: every route of the app's route table is in it, it is a valid OpenAPI 3.1
document, every example in it fits its schema (and every request example is accepted by the model
the endpoint validates with), and it carries the contract's envelope, error codes and credentials."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import OpenAPIV31SpecValidator
from starlette.routing import Route
from starlette.testclient import TestClient

from api.openapi import doc_of, openapi_path
from ingest.domain.errors import ALL_ERRORS

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@pytest.fixture
def doc(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    document: dict[str, Any] = r.json()
    return document


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def test_every_route_of_the_app_is_documented(client: TestClient, doc: dict[str, Any]) -> None:
    """Compared against the real Starlette route table: a route added without a `Doc` fails here."""
    served = set()
    for route in client.app.routes:  # type: ignore[attr-defined]
        assert isinstance(route, Route), f"{route!r}: only plain routes are expected"
        for method in route.methods or ():
            if method != "HEAD":
                served.add((openapi_path(route.path), method.lower()))
    documented = {(path, method) for path, method, _ in operations(doc)}
    assert served - documented == set(), "routes missing from /openapi.json"
    assert documented - served == set(), "operations /openapi.json invents"
    assert len(served) >= 50
    for route in client.app.routes:  # type: ignore[attr-defined]
        methods = set(route.methods or ()) - {"HEAD", "OPTIONS"}
        if methods:
            assert doc_of(route.endpoint) is not None, route.path


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    OpenAPIV31SpecValidator(doc).validate()


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """`schema` with the document's components beside it, so `#/components/...` refs resolve."""
    return Draft202012Validator({**schema, "components": doc["components"]}, format_checker=FormatChecker())


def _examples(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(where, schema, example) for every example in the document."""
    for path, method, op in operations(doc):
        where = f"{method.upper()} {path}"
        for param in op.get("parameters", []):
            if "example" in param:
                yield f"{where} {param['name']}", param["schema"], param["example"]
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            if "example" in content:
                yield f"{where} request {media}", content["schema"], content["example"]
        for status, response in op["responses"].items():
            for media, content in response.get("content", {}).items():
                if "example" in content:
                    yield f"{where} {status} {media}", content["schema"], content["example"]
                for name, example in content.get("examples", {}).items():
                    yield f"{where} {status} {name}", content["schema"], example["value"]


def test_every_example_fits_its_schema(doc: dict[str, Any]) -> None:
    examples = list(_examples(doc))
    assert len(examples) > 200  # request, success and one per error code of every operation
    problems = []
    for where, schema, example in examples:
        errors = list(_validator(doc, schema).iter_errors(example))
        if errors:
            problems.append(f"{where}: {errors[0].message}")
    assert problems == []


def test_every_request_example_is_accepted_by_the_endpoint_model(client: TestClient) -> None:
    """The examples shown for request bodies pass the very models the endpoints validate with."""
    checked = 0
    for route in client.app.routes:  # type: ignore[attr-defined]
        doc = doc_of(route.endpoint)
        if doc is not None and doc.body is not None:
            assert doc.example is not None, f"{route.path}: a request example is missing"
            doc.body.model_validate(doc.example)
            checked += 1
    assert checked >= 15


def test_the_error_envelope_is_shared_and_every_error_response_uses_it(doc: dict[str, Any]) -> None:
    envelope = doc["components"]["schemas"]["Error"]
    assert envelope["required"] == ["error"]
    assert envelope["properties"]["error"]["required"] == ["code", "message", "doc_url"]
    for path, method, op in operations(doc):
        for status, response in op["responses"].items():
            json_body = response.get("content", {}).get("application/json")
            if (path, status) == ("/healthz", "503"):  # starting: `{"data": {"status": "starting"}}`
                continue
            if int(status) >= 400 and json_body is not None:
                assert json_body["schema"]["allOf"][0] == {"$ref": "#/components/schemas/Error"}, (
                    f"{method} {path} {status}"
                )


def _codes(op: dict[str, Any]) -> set[str]:
    codes: set[str] = set()
    for status, response in op["responses"].items():
        json_body = response.get("content", {}).get("application/json")
        if int(status) >= 400 and json_body is not None and "allOf" in json_body["schema"]:
            codes |= set(json_body["schema"]["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"])
    return codes


def test_each_operation_lists_the_codes_it_can_answer(doc: dict[str, Any]) -> None:
    paths = doc["paths"]
    sale = _codes(paths["/api/v1/track/sale"]["post"])
    assert {
        "missing_credentials",
        "malformed_authorization",
        "invalid_api_key",
        "api_key_rotation_required",
        "program_key_required",
        "invalid_json",
        "payload_too_large",
        "validation_error",
        "duplicate_transaction",
        "database_unavailable",
    } <= sale
    assert "account_token_required" not in sale
    assert {"account_token_required", "owner_required", "program_not_found", "conflict"} <= _codes(
        paths["/api/v1/programs/{program_id}/partners"]["post"]
    )
    assert {"agent_key_required", "insufficient_scope"} <= _codes(paths["/api/agent/v1/programs"]["get"])
    assert "operator_token_required" in _codes(paths["/api/v1/operator/accounts"]["post"])
    assert "invalid_signature" in _codes(paths["/webhooks/stripe"]["post"])
    assert {"rate_limited", "partner_not_found"} <= _codes(paths["/api/v1/track/click"]["post"])
    # every code of the contract (section 9) is answered by some operation
    everywhere = set().union(*(_codes(op) for _, _, op in operations(doc)))
    contract = {cls.code for cls in ALL_ERRORS} - {"internal_error", "service_unavailable"}
    assert contract - everywhere == set()


def test_credentials_are_security_schemes(doc: dict[str, Any]) -> None:
    schemes = doc["components"]["securitySchemes"]
    for name in ("programKey", "accountToken", "operatorToken", "agentKey"):
        assert schemes[name]["type"] == "http" and schemes[name]["scheme"] == "bearer"
    assert schemes["stripeSignature"] == {
        **schemes["stripeSignature"],
        "in": "header",
        "name": "Stripe-Signature",
    }
    assert schemes["dashboardSession"] == {
        **schemes["dashboardSession"],
        "in": "cookie",
        "name": "tally_session",
    }
    paths = doc["paths"]
    assert paths["/api/v1/track/sale"]["post"]["security"] == [{"programKey": []}]
    assert paths["/api/v1/track/lead"]["post"]["security"] == [{"programKey": []}, {}]
    assert paths["/api/v1/track/click"]["post"]["security"] == []
    assert paths["/api/v1/programs/{program_id}/backfill"]["post"]["security"] == [
        {"accountToken": []},
        {"operatorToken": []},
    ]
    assert paths["/webhooks/stripe"]["post"]["security"] == [{"stripeSignature": []}]
    assert paths["/dashboard"]["get"]["security"] == [{"dashboardSession": []}]


def test_request_schemas_come_from_the_endpoint_models(doc: dict[str, Any]) -> None:
    """The request schema is the model's own: a field, its bounds and `extra=forbid` as pydantic says."""
    from ingest.domain.inputs import SaleIn

    body = doc["paths"]["/api/v1/track/sale"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/SaleIn"}
    sale_in = doc["components"]["schemas"]["SaleIn"]
    assert sale_in["additionalProperties"] is False
    expected = SaleIn.model_json_schema(ref_template="#/components/schemas/{model}")
    assert sale_in["properties"] == expected["properties"]


def test_docs_page_and_its_assets_come_from_the_app(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    sources = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert sources and all(s.startswith("/") for s in sources), sources
    for source in sources:
        if source.startswith("/docs/assets/"):
            asset = client.get(source)
            assert asset.status_code == 200 and len(asset.content) > 100, source
    bundle = client.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith("application/javascript")
    assert b"SwaggerUIBundle" in bundle.content
