"""The `data` of the webhook endpoints' answers, as the OpenAPI document describes them
(tests/api/test_schemathesis.py checks every answer against them)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ingest.webhooks_out.inputs import EventType


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebhookEndpoint(_Out):
    """An endpoint; its signing secret masked (`whsec_••••••••` + its last 4 characters)."""

    endpoint_id: str
    program_id: str
    url: str
    description: str | None
    events: list[EventType]
    enabled: bool
    secret_masked: str
    previous_secret_expires_at: datetime | None  # the rotated-out secret signs beside the new until then
    created_at: datetime
    updated_at: datetime
    failing_since: datetime | None  # the first failed attempt since the last success
    disabled_at: datetime | None
    disabled_reason: str | None  # why tally disabled it (5 days of failures), null otherwise


class WebhookEndpointWithSecret(WebhookEndpoint):
    """An endpoint just made or whose secret was just rotated: the one answer with the secret."""

    secret: str


class WebhookEndpointDeleted(_Out):
    endpoint_id: str
    deleted: Literal[True]


class WebhookAttempt(_Out):
    attempt: int
    attempted_at: datetime
    status: Literal["succeeded", "failed"]
    response_status: int | None
    duration_ms: int | None
    response_body: str | None  # the answer's first 4 KiB
    error: str | None
    next_attempt_at: datetime | None


class WebhookDelivery(_Out):
    """One event to one endpoint: its status, the last attempt's answer, how many attempts were
    made (`attempt`), when the next is due, and every attempt (`attempt_log`)."""

    delivery_id: str
    endpoint_id: str
    event_id: str
    type: EventType
    status: Literal["pending", "succeeded", "failed"]
    response_status: int | None
    duration_ms: int | None
    attempt: int
    next_attempt_at: datetime | None
    created_at: datetime
    last_attempt_at: datetime | None
    error: str | None
    attempt_log: list[WebhookAttempt]
