"""Reading dashboard forms and query strings into the services' inputs, and validation errors
back into lines a page can show. Parsing only: the services decide what is valid."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

from api.http import read_body
from ingest.errors import TallyError, ValidationFailed

MAX_FORM_FIELDS = 50
INT_SETTINGS = ("commission_bps", "commission_flat", "recurring_months", "platform_fee_bps", "holding_days")


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (at most 1 MiB); any other body reads as an empty form."""
    raw = await read_body(request)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return {}
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        return {}
    return dict(pairs)


def query_int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 2**62:
        raise ValidationFailed(f"{name} must be a positive integer")
    return int(raw)


def problems(exc: TallyError) -> list[str]:
    fields: list[dict[str, str]] = exc.extra.get("fields", [])
    return [f"{f['field']}: {f['message']}" for f in fields] or [exc.message]


def partner_data(form: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The partner fields as typed (to refill the form) and as PartnerIn input (no blank email)."""
    fields = {name: form.get(name, "").strip() for name in ("code", "name", "email")}
    return fields, {k: v for k, v in fields.items() if v or k != "email"}


def settings_data(form: dict[str, str]) -> dict[str, Any]:
    """Form strings as SettingsPatch input: digits become ints, a blank `recurring_months` is
    lifetime (null); anything else is passed on for the model to refuse with a field message."""
    data: dict[str, Any] = {"name": form.get("name", "").strip()}
    data["commission_type"] = form.get("commission_type", "")
    for name in INT_SETTINGS:
        raw = form.get(name, "").strip()
        data[name] = int(raw) if raw.isdigit() else (raw or None)
    data["requires_server_side_leads"] = form.get("requires_server_side_leads") == "on"
    data["stripe_account_id"] = form.get("stripe_account_id", "").strip() or None
    return data
