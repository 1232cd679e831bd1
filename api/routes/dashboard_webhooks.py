"""The dashboard's Webhooks tab (workspace owners): a program's endpoints with their recent
deliveries (status, answer, duration, attempts, next retry) and a Resend button, a form to add
one, and per endpoint Ping, Rotate secret, Enable/Disable and Delete. A new signing secret is
shown once, on the page the POST redirects to (sealed with the session, like a new program key).
The work is the JSON API's own (ingest/webhooks_out/endpoints.py); the pages, sessions and CSRF
rules are api/routes/dashboard.py's."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from api.auth import state
from api.forms import MAX_FORM_FIELDS, problems
from api.http import read_body, validate
from api.openapi import document
from api.pages import render
from api.routes.dashboard import PROGRAM, _page, owned_program, page, posted, program_url, viewer
from api.session import sessions
from ingest import control
from ingest.domain.clock import utcnow
from ingest.domain.errors import NotFound, ProgramNotFound, ValidationFailed
from ingest.domain.records import Program
from ingest.webhooks_out import endpoints
from ingest.webhooks_out.events import DESCRIPTIONS, EVENT_TYPES
from ingest.webhooks_out.inputs import EndpointIn, EndpointPatch

NEW_SECRET = "new_webhook_secret:"  # noqa: S105 (a name, not a secret); + endpoint id: a secret shown once after create or rotate
RECENT = 20  # deliveries shown per endpoint


def _url(program: Program, query: dict[str, str] | None = None, anchor: str = "") -> str:
    suffix = "/webhooks" + (f"?{urlencode(query)}" if query else "") + (f"#{anchor}" if anchor else "")
    return program_url(program, suffix)


def _overview(request: Request, program: Program) -> list[dict[str, Any]]:
    store, now = state(request).store, utcnow()
    found = []
    for endpoint in endpoints.listing(store, program.program_id, now):
        log = endpoints.delivery_log(store, program.program_id, endpoint["endpoint_id"], None, RECENT)
        found.append({**endpoint, "deliveries": log})
    return found


async def _shown(request: Request, session_id: str, listed: list[dict[str, Any]]) -> dict[str, str]:
    """The secrets kept to be shown once on this page (taken: a reload shows none)."""
    shown: dict[str, str] = {}
    for endpoint in listed:
        name = NEW_SECRET + endpoint["endpoint_id"]
        secret = await asyncio.to_thread(sessions(request).take_once, session_id, name)
        if secret is not None:
            shown[endpoint["endpoint_id"]] = secret
    return shown


def _webhooks_page(
    request: Request,
    who: Any,
    program: Program,
    listed: list[dict[str, Any]],
    status: int = 200,
    **extra: Any,
) -> Response:
    return render(
        "webhooks.html",
        status,
        who,
        script=True,  # the copy buttons
        program=control.program_view(state(request).store, program),
        endpoints=listed,
        event_types=EVENT_TYPES,
        descriptions=DESCRIPTIONS,
        allow_private=state(request).settings.webhooks_allow_private,
        done=request.query_params.get("done"),
        **extra,
    )


@page
async def webhooks_page(request: Request) -> Response:
    who = viewer(request)
    program = owned_program(request, who)
    listed = await asyncio.to_thread(_overview, request, program)
    shown = await _shown(request, who.session_id, listed)
    return _webhooks_page(request, who, program, listed, new_secrets=shown)


def _events_of(raw: list[tuple[str, str]]) -> list[str]:
    return [value for name, value in raw if name == "events"]


async def _form_pairs(request: Request) -> list[tuple[str, str]]:
    """The form's fields in order, repeated ones included (the event type checkboxes); the body
    was read (and bounded) by `posted` already."""
    body = await read_body(request)
    return parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)


@page
async def add_endpoint(request: Request) -> Response:
    who, form = await posted(request)
    program = owned_program(request, who)
    pairs = await _form_pairs(request)
    data: dict[str, Any] = {"url": form.get("url", "").strip(), "events": _events_of(pairs)}
    if form.get("description", "").strip():
        data["description"] = form["description"].strip()
    st = state(request)
    try:
        inp = validate(EndpointIn, data)
        made = await asyncio.to_thread(
            endpoints.create, st.store, program.program_id, inp, st.settings.webhooks_allow_private, utcnow()
        )
    except ValidationFailed as exc:
        listed = await asyncio.to_thread(_overview, request, program)
        return _webhooks_page(
            request, who, program, listed, 422, new_secrets={}, form_errors=problems(exc), form=data
        )
    sessions(request).show_once(who.session_id, NEW_SECRET + made["endpoint_id"], made["secret"])
    return RedirectResponse(_url(program, {"done": "created"}, f"endpoint-{made['endpoint_id']}"), 303)


async def _act(request: Request, action: str) -> Response:
    who, form = await posted(request)
    program = owned_program(request, who)
    endpoint_id = str(request.path_params["endpoint_id"])
    st, now = state(request), utcnow()
    anchor = f"endpoint-{endpoint_id}"
    if action == "ping":
        await asyncio.to_thread(endpoints.ping, st.store, program.program_id, endpoint_id, now)
        _wake(request)
    elif action == "rotate":
        rotated = await asyncio.to_thread(endpoints.rotate, st.store, program.program_id, endpoint_id, now)
        sessions(request).show_once(who.session_id, NEW_SECRET + endpoint_id, rotated["secret"])
    elif action == "enabled":
        enabled = form.get("enabled") == "1"
        patch = EndpointPatch(enabled=enabled)
        allow = st.settings.webhooks_allow_private
        await asyncio.to_thread(
            endpoints.update, st.store, program.program_id, endpoint_id, patch, allow, now
        )
        if enabled:
            _wake(request)
    elif action == "delete":
        await asyncio.to_thread(endpoints.delete, st.store, program.program_id, endpoint_id)
        anchor = "endpoints"
    return RedirectResponse(_url(program, {"done": action}, anchor), 303)


def _wake(request: Request) -> None:
    worker = getattr(request.app.state, "webhooks", None)
    if worker is not None:
        worker.wake()


@page
async def ping(request: Request) -> Response:
    return await _act(request, "ping")


@page
async def rotate(request: Request) -> Response:
    return await _act(request, "rotate")


@page
async def enable(request: Request) -> Response:
    return await _act(request, "enabled")


@page
async def delete(request: Request) -> Response:
    return await _act(request, "delete")


@page
async def resend(request: Request) -> Response:
    who, _ = await posted(request)
    program = owned_program(request, who)
    endpoint_id = str(request.path_params["endpoint_id"])
    delivery_id = str(request.path_params["delivery_id"])
    st = state(request)
    await asyncio.to_thread(
        endpoints.resend, st.store, program.program_id, endpoint_id, delivery_id, utcnow()
    )
    _wake(request)
    return RedirectResponse(_url(program, {"done": "resent"}, f"delivery-{quote(delivery_id, safe='')}"), 303)


ONE = PROGRAM + "/webhooks/{endpoint_id}"
routes = [
    Route(PROGRAM + "/webhooks", webhooks_page, methods=["GET"]),
    Route(PROGRAM + "/webhooks", add_endpoint, methods=["POST"]),
    Route(ONE + "/ping", ping, methods=["POST"]),
    Route(ONE + "/rotate", rotate, methods=["POST"]),
    Route(ONE + "/enabled", enable, methods=["POST"]),
    Route(ONE + "/delete", delete, methods=["POST"]),
    Route(ONE + "/deliveries/{delivery_id}/resend", resend, methods=["POST"]),
]

_ERRORS = (ProgramNotFound, NotFound)
document(
    {
        webhooks_page: _page(
            "Webhooks: endpoints and their recent deliveries (owner)", errors=(ProgramNotFound,)
        ),
        add_endpoint: _page(
            "Add a webhook endpoint (owner)", form=True, errors=(ProgramNotFound, ValidationFailed)
        ),
        ping: _page("Send a test ping to a webhook endpoint (owner)", form=True, errors=_ERRORS),
        rotate: _page("Rotate a webhook endpoint's signing secret (owner)", form=True, errors=_ERRORS),
        enable: _page("Enable or disable a webhook endpoint (owner)", form=True, errors=_ERRORS),
        delete: _page("Delete a webhook endpoint (owner)", form=True, errors=_ERRORS),
        resend: _page("Send a webhook delivery again (owner)", form=True, errors=_ERRORS),
    }
)
