"""The OpenAPI 3.1 document (`GET /openapi.json`), built from the app's own route table and the
pydantic models the endpoints validate with.

Each route module describes its endpoints in one table next to its `routes` list:

    document({track_sale: Doc("Record a sale", "track", auth=(PROGRAM_KEY,), body=SaleIn, ...)})

keyed by the endpoint function the `Route` holds. `build(app)` walks `app.routes`: every
(path, method) whose endpoint has a `Doc` becomes an operation; request bodies are the models'
`model_json_schema`, response data the `data` type's schema (pydantic `TypeAdapter`), and the
error responses list, per status, exactly the codes the operation can answer (its credentials,
its body and the `errors` it names) as the shared error envelope with an `enum` of those codes.
A route without a `Doc` is left out of the document, and tests/api/test_openapi.py fails on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter
from starlette.routing import BaseRoute, Route

from ingest.domain import errors as E  # noqa: N812

log = logging.getLogger("tally.openapi")

Endpoint = Callable[..., Any]

# Credentials (CONTRACT section 2): the security schemes' names.
PROGRAM_KEY = "programKey"
ACCOUNT_TOKEN = "accountToken"  # noqa: S105 (a scheme name)
OPERATOR_TOKEN = "operatorToken"  # noqa: S105 (a scheme name)
AGENT_KEY = "agentKey"
STRIPE_SIGNATURE = "stripeSignature"
DASHBOARD_SESSION = "dashboardSession"
PARTNER_SESSION = "partnerSession"

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    PROGRAM_KEY: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "aff_...",
        "description": "The program API key (`aff_` + 32 base62 characters; legacy keys without the "
        "prefix keep working), shown once when generated. Track sale, refund and server-mode lead.",
    },
    ACCOUNT_TOKEN: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "acct_...",
        "description": "An account token (`acct_...`), issued when the account is created.",
    },
    OPERATOR_TOKEN: {
        "type": "http",
        "scheme": "bearer",
        "description": "The operator token: the value of `TALLY_OPERATOR_TOKEN`.",
    },
    AGENT_KEY: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "agt_...",
        "description": "An agent key (`agt_...`) with scopes, limited to the workspaces it was granted.",
    },
    STRIPE_SIGNATURE: {
        "type": "apiKey",
        "in": "header",
        "name": "Stripe-Signature",
        "description": "`t=<unix>,v1=<hex>[,v1=...]`: HMAC-SHA256 of `{t}.{raw body}` with a secret of "
        "`TALLY_STRIPE_WEBHOOK_SECRETS`, at most `TALLY_STRIPE_TOLERANCE_SECONDS` old.",
    },
    DASHBOARD_SESSION: {
        "type": "apiKey",
        "in": "cookie",
        "name": "tally_session",
        "description": "The dashboard's session cookie, set by logging in with an account token.",
    },
    PARTNER_SESSION: {
        "type": "apiKey",
        "in": "cookie",
        "name": "tally_partner",
        "description": "The partners' portal session cookie, set by a one-time sign-in link.",
    },
}

# The errors each credential can answer (CONTRACT section 9).
AUTH_ERRORS: dict[str, tuple[type[E.TallyError], ...]] = {
    PROGRAM_KEY: (
        E.MissingCredentials,
        E.MalformedAuthorization,
        E.InvalidApiKey,
        E.ApiKeyRotationRequired,
        E.ProgramKeyRequired,
    ),
    ACCOUNT_TOKEN: (E.MissingCredentials, E.MalformedAuthorization, E.AccountTokenRequired),
    OPERATOR_TOKEN: (E.MissingCredentials, E.MalformedAuthorization, E.OperatorTokenRequired),
    AGENT_KEY: (E.MissingCredentials, E.MalformedAuthorization, E.AgentKeyRequired, E.InsufficientScope),
    STRIPE_SIGNATURE: (E.InvalidSignature,),
    DASHBOARD_SESSION: (),
    PARTNER_SESSION: (),
}
# Every request body can be refused these ways (api/http.py).
BODY_ERRORS: tuple[type[E.TallyError], ...] = (
    E.InvalidJson,
    E.RequestTimeout,
    E.PayloadTooLarge,
    E.ValidationFailed,
)
# Any operation: an unknown method on a known path, and a write the database cannot take.
# Every operation: a method it does not take; a NUL in its URL (api/failsafe.py).
COMMON_ERRORS: tuple[type[E.TallyError], ...] = (E.MethodNotAllowed, E.ValidationFailed)
WRITE_ERRORS: tuple[type[E.TallyError], ...] = (E.DatabaseUnavailable,)

JSON = "application/json"
HTML = "text/html"


@dataclass(frozen=True)
class Param:
    """A query or path parameter."""

    name: str
    schema: dict[str, Any]
    description: str = ""
    where: str = "query"
    required: bool = False
    example: Any = None


@dataclass(frozen=True)
class Doc:
    """One operation's documentation. `auth` names security schemes (any one of them will do;
    `auth_optional` adds "none"); `body` is the request model the endpoint validates with;
    `data` the type of the success envelope's `data` (None: no JSON body, see `content`)."""

    summary: str
    tag: str
    description: str = ""
    auth: tuple[str, ...] = ()
    auth_optional: bool = False
    body: type[BaseModel] | None = None
    body_schema: dict[str, Any] | None = None
    body_media: str = JSON
    example: Any = None
    status: int = 200
    data: Any = None
    result: Any = None
    warnings: bool = False
    content: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    errors: tuple[type[E.TallyError], ...] = ()
    params: tuple[Param, ...] = ()
    writes: bool = False
    extra_responses: Mapping[int, dict[str, Any]] = field(default_factory=dict)
    html_errors: bool = False


_DOCS: dict[Endpoint, Doc] = {}


def document(docs: Mapping[Endpoint, Doc]) -> None:
    """Register the documentation of endpoints (keyed by the function their `Route` holds)."""
    _DOCS.update(docs)


def doc_of(endpoint: Endpoint) -> Doc | None:
    return _DOCS.get(endpoint)


def operations(routes: Iterable[BaseRoute]) -> list[tuple[str, str, Endpoint]]:
    """Every (path, method, endpoint) the route table answers (HEAD, implied by GET, left out)."""
    found: list[tuple[str, str, Endpoint]] = []
    for route in routes:
        if isinstance(route, Route):
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    found.append((route.path, method, route.endpoint))
    return found


# -- shared schemas ---------------------------------------------------------------------------
ERROR_ENVELOPE: dict[str, Any] = {
    "type": "object",
    "description": "Every JSON error (CONTRACT section 1). Clients branch on `error.code`.",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "doc_url"],
            "properties": {
                "code": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                "message": {"type": "string"},
                "doc_url": {"type": "string", "format": "uri"},
                "fields": {
                    "type": "array",
                    "description": "validation_error: each violation",
                    "items": {
                        "type": "object",
                        "required": ["field", "message"],
                        "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
                "deadline": {"type": "string", "format": "date-time"},
                "retry_after": {"type": "integer"},
                "stored": {"type": "boolean"},
                "recorded": {
                    "type": "boolean",
                    "description": "sale_not_found on explain: whether the log has the sale (true: "
                    "recorded but not reconciled yet)",
                },
                "hint": {"type": "string", "description": "What to do next, in words"},
            },
        }
    },
}
WARNING: dict[str, Any] = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "deadline": {"type": "string", "format": "date-time"},
    },
}
REQUEST_ID_HEADER = {
    "description": "The request's id: the client's `X-Request-Id` when sane, else a new one.",
    "schema": {"type": "string"},
}
# Carried by every answer to a program key flagged for rotation (CONTRACT section 3).
ROTATION_HEADERS = {
    "Deprecation": {
        "description": "`@<unix seconds when the key was flagged>`",
        "schema": {"type": "string"},
    },
    "Sunset": {"description": "The rotation deadline (IMF-fixdate)", "schema": {"type": "string"}},
    "Link": {
        "description": '`<{base_url}/docs/errors#api_key_rotation_required>; rel="deprecation"`',
        "schema": {"type": "string"},
    },
}


def _error_example(cls: type[E.TallyError], base_url: str) -> dict[str, Any]:
    error: dict[str, Any] = {
        "code": cls.code,
        "message": (cls.__doc__ or cls.code).strip().split("\n")[0],
        "doc_url": f"{base_url}/docs/errors#{cls.code}",
    }
    if cls is E.ValidationFailed:
        error["fields"] = [{"field": "amount", "message": "Input should be greater than or equal to 1"}]
    if cls is E.ApiKeyRotationRequired:
        error["deadline"] = "2026-12-01T00:00:00Z"
    if cls is E.RateLimited or cls is E.ReconcileRunning:
        error["retry_after"] = 1
    return {"error": error}


class _Builder:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.schemas: dict[str, Any] = {"Error": ERROR_ENVELOPE, "Warning": WARNING}

    def component(self, name: str, schema: dict[str, Any]) -> None:
        """A shared schema; two different types of one name would make a ref ambiguous."""
        if self.schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two different schemas are named {name}: rename one of the types")

    def schema_of(self, annotation: Any, mode: str) -> dict[str, Any]:
        """The JSON schema of a model or type; its definitions become shared components."""
        schema = TypeAdapter(annotation).json_schema(
            mode=mode,  # type: ignore[arg-type]
            ref_template="#/components/schemas/{model}",
        )
        for name, definition in schema.pop("$defs", {}).items():
            self.component(name, definition)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and "title" in schema:
            name = annotation.__name__
            self.component(name, schema)
            return {"$ref": f"#/components/schemas/{name}"}
        return schema

    @staticmethod
    def rotation(doc: Doc) -> dict[str, Any]:
        return ROTATION_HEADERS if PROGRAM_KEY in doc.auth else {}

    def errors(self, doc: Doc) -> list[type[E.TallyError]]:
        found: list[type[E.TallyError]] = []
        for scheme in doc.auth:
            found += AUTH_ERRORS[scheme]
        if doc.body is not None or doc.body_schema is not None:
            found += BODY_ERRORS
        if doc.writes:
            found += WRITE_ERRORS
        found += doc.errors
        found += COMMON_ERRORS
        unique: list[type[E.TallyError]] = []
        for cls in found:
            if cls not in unique:
                unique.append(cls)
        return unique

    def error_responses(self, doc: Doc) -> dict[str, Any]:
        by_status: dict[int, list[type[E.TallyError]]] = {}
        for cls in self.errors(doc):
            by_status.setdefault(cls.status, []).append(cls)
        responses: dict[str, Any] = {}
        for status, classes in sorted(by_status.items()):
            codes = [c.code for c in classes]
            schema = {
                "allOf": [
                    {"$ref": "#/components/schemas/Error"},
                    {"properties": {"error": {"properties": {"code": {"enum": codes}}}}},
                ]
            }
            lines = "\n".join(f"- `{c.code}`: {(c.__doc__ or '').strip().splitlines()[0]}" for c in classes)
            headers: dict[str, Any] = {"X-Request-Id": REQUEST_ID_HEADER, **self.rotation(doc)}
            if status == 429 or E.ReconcileRunning in classes or E.DatabaseUnavailable in classes:
                headers["Retry-After"] = {"schema": {"type": "integer"}, "description": "seconds"}
            content: dict[str, Any] = {
                JSON: {
                    "schema": schema,
                    "examples": {c.code: {"value": _error_example(c, self.base_url)} for c in classes},
                }
            }
            if doc.html_errors:
                content = {HTML: {"schema": {"type": "string"}}}
            responses[str(status)] = {"description": lines, "headers": headers, "content": content}
        return responses

    def operation(self, path: str, method: str, doc: Doc) -> dict[str, Any]:
        op: dict[str, Any] = {
            "summary": doc.summary,
            "tags": [doc.tag],
            "operationId": _operation_id(method, path),
        }
        if doc.description:
            op["description"] = doc.description
        params = [_param(p) for p in doc.params]
        known = {p.name for p in doc.params if p.where == "path"}
        for name in _path_params(path):
            if name not in known:
                params.append(_param(Param(name, {"type": "string", "minLength": 1}, where="path")))
        if params:
            op["parameters"] = params
        if doc.auth:
            op["security"] = [{scheme: []} for scheme in doc.auth]
            if doc.auth_optional:
                op["security"].append({})
        else:
            op["security"] = []
        if doc.body is not None or doc.body_schema is not None:
            schema = doc.body_schema if doc.body is None else self.schema_of(doc.body, "validation")
            body_content: dict[str, Any] = {"schema": schema}
            if doc.example is not None:
                body_content["example"] = doc.example
            op["requestBody"] = {"required": True, "content": {doc.body_media: body_content}}
        responses: dict[str, Any] = {}
        success: dict[str, Any] = {
            "description": "Success",
            "headers": {"X-Request-Id": REQUEST_ID_HEADER, **self.rotation(doc)},
        }
        if doc.data is not None:
            envelope: dict[str, Any] = {
                "type": "object",
                "required": ["data"],
                "additionalProperties": False,
                "properties": {"data": self.schema_of(doc.data, "serialization")},
            }
            if doc.warnings:
                envelope["properties"]["warnings"] = {
                    "type": "array",
                    "minItems": 1,
                    "items": {"$ref": "#/components/schemas/Warning"},
                }
            media: dict[str, Any] = {"schema": envelope}
            if doc.result is not None:
                media["example"] = {"data": doc.result}
            success["content"] = {JSON: media, **doc.content}
        elif doc.content:
            success["content"] = dict(doc.content)
        responses[str(doc.status)] = success
        for status, extra in doc.extra_responses.items():
            responses[str(status)] = extra
        responses.update(self.error_responses(doc))
        op["responses"] = responses
        return op


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}").split(":")[0].replace("-", "_").replace(".", "_") for w in path.split("/") if w]
    return method.lower() + "_" + "_".join(words or ["root"])


def _path_params(path: str) -> list[str]:
    return [part[1:-1].split(":")[0] for part in path.split("/") if part.startswith("{")]


def _param(p: Param) -> dict[str, Any]:
    out: dict[str, Any] = {"name": p.name, "in": p.where, "schema": p.schema}
    if p.where == "path" or p.required:
        out["required"] = True
    if p.description:
        out["description"] = p.description
    if p.example is not None:
        out["example"] = p.example
    return out


def openapi_path(path: str) -> str:
    """A Starlette path as OpenAPI writes it (`{name:path}` -> `{name}`)."""
    return "/".join(
        "{" + part[1:-1].split(":")[0] + "}" if part.startswith("{") else part for part in path.split("/")
    )


def build(routes: Iterable[BaseRoute], base_url: str, version: str) -> dict[str, Any]:
    builder = _Builder(base_url)
    paths: dict[str, dict[str, Any]] = {}
    tags: list[str] = []
    for path, method, endpoint in operations(routes):
        doc = doc_of(endpoint)
        if method == "OPTIONS":
            doc = _preflight(path)
        if doc is None:
            log.warning("openapi: %s %s has no documentation; left out", method, path)
            continue
        if doc.tag not in tags:
            tags.append(doc.tag)
        paths.setdefault(openapi_path(path), {})[method.lower()] = builder.operation(path, method, doc)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tally",
            "version": version,
            "description": "Partner-referral tracking: clicks, leads, sales and refunds in; attribution, "
            'commissions, reports out. Every JSON success is `{"data": ...}` (plus `warnings` only when '
            "there is one); every JSON error is the `Error` envelope, whose `code` clients branch on "
            f"(each documented at {base_url}/docs/errors). Every response carries `X-Request-Id`.",
        },
        "servers": [{"url": base_url}],
        "tags": [{"name": t, "description": TAGS.get(t, "")} for t in sorted(tags, key=_tag_order)],
        "paths": paths,
        "components": {"schemas": builder.schemas, "securitySchemes": SECURITY_SCHEMES},
    }


def _tag_order(tag: str) -> int:
    return list(TAGS).index(tag) if tag in TAGS else len(TAGS)


def _preflight(path: str) -> Doc:
    return Doc(
        "CORS preflight (any origin, no credentials)",
        "track" if path.startswith("/api/v1/track") else "browser",
        status=204,
    )


TAGS = {
    "track": "Clicks, leads, sales and refunds (CONTRACT section 4).",
    "webhooks": "The payment processor's connect webhook (CONTRACT section 5).",
    "accounts": "Workspaces, members, programs, keys and partners (account token, CONTRACT section 6).",
    "reads": "Sales, explain, commissions, reports, the tracking log and the checklist (section 7).",
    "engineering": "Metadata fixes, backfill and period close (owner or operator, section 7).",
    "payouts": "Payout batches: create, list, export, mark paid (owner, section 7).",
    "webhooks-out": "Webhooks to brand servers: endpoints, deliveries, pings (owner, section 13).",
    "agent": "Agent endpoints (agt_ keys with scopes, section 8).",
    "operator": "Operator endpoints (TALLY_OPERATOR_TOKEN).",
    "operations": "Health, readiness and this reference (section 12).",
    "browser": "The browser script (section 4).",
    "dashboard": "Server-rendered dashboard pages (HTML, session cookie after logging in).",
}
