"""Accounts, workspaces, programs, partners and credentials: the control plane's write side.

Every function validates against the store first, then hands one operation to the writer.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ingest import actions
from ingest.domain.clock import utcnow
from ingest.domain.errors import (
    Conflict,
    NotFound,
    OwnerRequired,
    StripeAccountInUse,
    ValidationFailed,
)
from ingest.domain.inputs import (
    AccountIn,
    AgentKeyIn,
    MemberIn,
    PartnerIn,
    ProgramCreateIn,
    SettingsPatch,
)
from ingest.domain.records import Credential, Partner, Program, ProgramSettings
from ingest.domain.tokens import (
    ACCOUNT_TOKEN_PREFIX,
    AGENT_KEY_PREFIX,
    PROGRAM_KEY_PREFIX,
    mask,
    new_id,
    new_token,
    token_hash,
)
from ingest.storage.contract import Store, Tx
from ingest.writer import Writer


def _credential(value: str, kind: Any, subject_id: str, at: datetime, **extra: Any) -> Credential:
    return Credential(token_hash(value), kind, subject_id, mask(value), at, **extra)


def program_view(store: Store, program: Program) -> dict[str, Any]:
    """A program as every read shows it: settings and the masked key, never the key."""
    cred = store.program_credential(program.program_id)
    return {
        "program_id": program.program_id,
        "workspace_id": program.workspace_id,
        "name": program.name,
        **program.settings.model_dump(),
        "api_token_masked": cred.masked if cred else None,
        "api_key_rotation_deadline": cred.rotation_deadline if cred else None,
        "created_at": program.created_at,
        "updated_at": program.updated_at,
    }


def partner_view(partner: Partner) -> dict[str, Any]:
    return {
        "partner_id": partner.partner_id,
        "program_id": partner.program_id,
        "code": partner.code,
        "name": partner.name,
        "email": partner.email,
        "created_at": partner.created_at,
    }


# -- accounts and members --------------------------------------------------------------------
async def create_account(writer: Writer, inp: AccountIn) -> dict[str, Any]:
    now = utcnow()
    account_id, workspace_id = new_id("acc"), new_id("ws")
    token = new_token(ACCOUNT_TOKEN_PREFIX)

    def op(tx: Tx) -> None:
        tx.add_account(account_id, inp.email, now)
        tx.add_workspace(workspace_id, inp.workspace_name, now)
        tx.add_member(workspace_id, account_id, "owner", now)
        tx.add_credential(_credential(token, "account", account_id, now))

    await writer.run(op)
    return {"account_id": account_id, "workspace_id": workspace_id, "token": token}


def require_owner(store: Store, workspace_id: str, account_id: str) -> None:
    role = store.role(workspace_id, account_id)
    if role is None:
        raise NotFound(f"workspace {workspace_id} not found")
    if role != "owner":
        raise OwnerRequired(f"only an owner of workspace {workspace_id} can do this")


async def add_member(
    store: Store, writer: Writer, actor: str, workspace_id: str, inp: MemberIn
) -> dict[str, Any]:
    require_owner(store, workspace_id, actor)
    now = utcnow()
    account_id = new_id("acc")
    token = new_token(ACCOUNT_TOKEN_PREFIX)

    def op(tx: Tx) -> None:
        tx.add_account(account_id, inp.email, now)
        tx.add_member(workspace_id, account_id, inp.role, now)
        tx.add_credential(_credential(token, "account", account_id, now))

    await writer.run(op)
    return {
        "account_id": account_id,
        "token": token,
        "workspace_id": workspace_id,
        "role": inp.role,
    }


# -- programs ----------------------------------------------------------------------------------
def _settings(inp: SettingsPatch, base: ProgramSettings) -> ProgramSettings:
    try:
        return inp.apply(base)
    except ValidationError as exc:
        fields = [
            {"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]} for err in exc.errors()
        ]
        raise ValidationFailed("program settings are not valid", fields=fields) from exc


def _claim_stripe_account(tx: Tx, program: Program) -> None:
    """Refuse a processor account already used by a program of another workspace (programs of
    one workspace may share one). Called inside the writer operation that saves `program`, on
    the transaction (which, on a shared database, holds the account until it commits), so of
    two concurrent claims from different workspaces only the first can win."""
    account = program.settings.stripe_account_id
    if account is None:
        return
    for other in tx.programs_for_stripe_account(account):
        if other.workspace_id != program.workspace_id:
            raise StripeAccountInUse(
                f"processor account {account} is connected to a program of another workspace; "
                f"program {program.program_id} cannot use it"
            )


async def create_program(store: Store, writer: Writer, actor: str, inp: ProgramCreateIn) -> Program:
    require_owner(store, inp.workspace_id, actor)
    settings = _settings(inp, ProgramSettings())
    now = utcnow()
    program = Program(new_id("prog"), inp.workspace_id, inp.name, settings, now, now)
    # Creating a program creates its key; nobody ever sees this value (regenerate to get one).
    unseen = new_token(PROGRAM_KEY_PREFIX)

    def op(tx: Tx) -> None:
        _claim_stripe_account(tx, program)
        tx.put_program(program)
        tx.add_credential(_credential(unseen, "program", program.program_id, now))

    await writer.run(op)
    return program


async def update_program(
    store: Store, writer: Writer, program: Program, inp: SettingsPatch, actor: str
) -> Program:
    """Save new settings; a change of the money terms is also appended to the raw log
    (actions.terms_row): sales that occur from then on are valued with the new terms."""
    settings = _settings(inp, program.settings)
    updated = replace(program, settings=settings, name=inp.name or program.name, updated_at=utcnow())
    # A program keeps the account it has (even one shared across workspaces before this check).
    claims = settings.stripe_account_id != program.settings.stripe_account_id
    change = actions.terms_row(program, program.settings, settings, actor)

    def op(tx: Tx) -> None:
        if claims:
            _claim_stripe_account(tx, updated)
        tx.put_program(updated)
        if change is not None:
            tx.append(change)

    await writer.run(op)
    return updated


async def regenerate_key(
    store: Store, writer: Writer, program: Program, value: str | None = None
) -> dict[str, Any]:
    """Issue a new program key (or import `value`, a legacy key). The old key stops at once."""
    now = utcnow()
    key = value if value is not None else new_token(PROGRAM_KEY_PREFIX)
    cred = _credential(key, "program", program.program_id, now)

    def op(tx: Tx) -> None:
        if tx.credential_used(cred.token_hash):
            raise Conflict("that key value has already been used; choose another")
        tx.revoke_credentials("program", program.program_id, now)
        tx.add_credential(cred)
        tx.check(program.program_id, "api_key_generated", now)

    await writer.run(op)
    return {"api_key": key, "api_token_masked": cred.masked, "created_at": now}


async def flag_rotation(store: Store, writer: Writer, program: Program, deadline: datetime) -> dict[str, Any]:
    cred = store.program_credential(program.program_id)
    if cred is None:
        raise NotFound(f"program {program.program_id} has no key")
    now = utcnow()

    def op(tx: Tx) -> None:
        tx.flag_credential(cred.token_hash, now, deadline)

    await writer.run(op)
    return {
        "program_id": program.program_id,
        "api_token_masked": cred.masked,
        "flagged_at": now,
        "deadline": deadline,
    }


async def add_partner(store: Store, writer: Writer, program: Program, inp: PartnerIn) -> Partner:
    if store.partner(program.program_id, inp.code) is not None:
        raise Conflict(f"partner code {inp.code} already exists in program {program.program_id}")
    partner = Partner(new_id("ptn"), program.program_id, inp.code, inp.name, inp.email, utcnow())

    def op(tx: Tx) -> None:
        tx.add_partner(partner)

    await writer.run(op)
    return partner


async def create_agent_key(store: Store, writer: Writer, inp: AgentKeyIn) -> dict[str, Any]:
    for ws in inp.workspace_ids:
        if not store.workspace_exists(ws):
            raise ValidationFailed(
                f"workspace {ws} does not exist",
                fields=[{"field": "workspace_ids", "message": f"unknown {ws}"}],
            )
    now = utcnow()
    agent_id = new_id("agent")
    key = new_token(AGENT_KEY_PREFIX)
    cred = _credential(
        key,
        "agent",
        agent_id,
        now,
        scopes=frozenset(inp.scopes),
        workspace_ids=frozenset(inp.workspace_ids),
        name=inp.name,
    )

    def op(tx: Tx) -> None:
        tx.add_credential(cred)

    await writer.run(op)
    return {
        "agent_key": key,
        "agent_id": agent_id,
        "scopes": sorted(inp.scopes),
        "workspace_ids": inp.workspace_ids,
    }
