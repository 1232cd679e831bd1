"""Typed control-plane records shared by the store, the services and the API."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CredentialKind = Literal["program", "agent", "account"]
Role = Literal["owner", "member"]


class ProgramSettings(BaseModel):
    """Commission and integration settings of a program (CONTRACT section 6)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    commission_type: Literal["percent", "flat"] = "percent"
    commission_bps: int = Field(default=3000, ge=0, le=10000)
    commission_flat: int = Field(default=0, ge=0)
    recurring_months: int | None = Field(default=None, ge=0)
    platform_fee_bps: int = Field(default=0, ge=0, le=10000)
    holding_days: int = Field(default=30, ge=0)
    requires_server_side_leads: bool = False
    stripe_account_id: str | None = Field(default=None, min_length=1, max_length=255)


SETTING_NAMES: tuple[str, ...] = tuple(ProgramSettings.model_fields)


@dataclass(frozen=True)
class Program:
    program_id: str
    workspace_id: str
    name: str
    settings: ProgramSettings
    created_at: datetime
    updated_at: datetime
    api_token_masked: str | None = None


@dataclass(frozen=True)
class Partner:
    partner_id: str
    program_id: str
    code: str
    name: str
    email: str | None
    created_at: datetime


@dataclass(frozen=True)
class Credential:
    """A stored credential: never the value, only its hash and what it grants."""

    token_hash: str
    kind: CredentialKind
    subject_id: str  # program id, agent key id or account id
    masked: str
    created_at: datetime
    scopes: frozenset[str] = frozenset()
    workspace_ids: frozenset[str] = frozenset()
    name: str | None = None
    revoked_at: datetime | None = None
    flagged_at: datetime | None = None
    rotation_deadline: datetime | None = None


@dataclass(frozen=True)
class Binding:
    """The first settled lead of a customer in a program, which binds it to a partner."""

    lead_id: str
    click_id: str | None
    partner_code: str | None


@dataclass
class SaleLedger:
    """What ingest knows of a recorded sale: enough to refuse duplicates and over-refunds."""

    amount: int | None
    currency: str | None
    refunded: int = 0
    refund_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class LogLine:
    log_id: int
    program_id: str
    logged_at: datetime
    endpoint: str
    status: int
    outcome: str
    detail: str
    request_id: str | None
    raw_seq: int | None
