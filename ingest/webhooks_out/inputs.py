"""The webhook endpoint requests' models (strict, like every request body of ours): the URL's
shape and the event types here; whether the URL may be reached is `addresses.url_problem`, which
needs the server's `TALLY_WEBHOOKS_ALLOW_PRIVATE` (ingest/webhooks_out/endpoints.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator

from ingest.domain.bounds import MAX_TEXT, MAX_URL, free_text, one_line, storable

EventType = Literal[
    "sale.created",
    "sale.attributed",
    "sale.refunded",
    "commission.created",
    "commission.approved",
    "commission.adjusted",
    "commission.voided",
    "payout.created",
    "payout.paid",
    "api_key.rotation_required",
    "ping",
]


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("must not name an event type twice")
    return values


Events = Annotated[list[EventType], Field(min_length=1, max_length=11), AfterValidator(_unique)]
EndpointUrl = Annotated[str, Field(min_length=1, max_length=MAX_URL), AfterValidator(one_line)]
Description = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(free_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return storable(value)


class EndpointIn(_Strict):
    """`POST /api/v1/programs/{id}/webhook-endpoints`."""

    url: EndpointUrl
    events: Events
    description: Description | None = None


class EndpointPatch(_Strict):
    """`PATCH .../webhook-endpoints/{endpoint_id}`: what is given changes."""

    url: EndpointUrl | None = None
    events: Events | None = None
    enabled: StrictBool | None = None
    description: Description | None = None
