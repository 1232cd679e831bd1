"""Credential checks: who is calling, with which kind of credential, for what.

All credentials travel as `Authorization: Bearer <value>` and are matched by hash on the whole
value. A credential of the wrong kind is refused with a code that names the cause.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.requests import Request

from api.http import header, remember
from api.state import State
from ingest.domain.clock import rfc3339, utcnow
from ingest.domain.errors import (
    AccountTokenRequired,
    AgentKeyRequired,
    ApiKeyRotationRequired,
    InsufficientScope,
    InvalidApiKey,
    MalformedAuthorization,
    MissingCredentials,
    OperatorTokenRequired,
    ProgramKeyRequired,
    ProgramNotFound,
)
from ingest.domain.records import Credential, Program, Role
from ingest.domain.tokens import token_hash
from ingest.storage.contract import Store

OPERATOR = "operator"


def state(request: Request) -> State:
    """The app's lifetime state (kept in the scope after the first lookup of a request)."""
    st: State | None = request.scope.get("tally")
    if st is None:
        st = request.scope["tally"] = request.app.state.tally
    return st


def bearer(request: Request) -> str | None:
    """The bearer token, None when there is no Authorization header at all."""
    value = header(request, b"authorization")
    if value is None:
        return None
    scheme, _, value = value.partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value or " " in value:
        raise MalformedAuthorization("the Authorization header must be 'Bearer <token>'")
    return value


def is_operator(request: Request, token: str) -> bool:
    expected = state(request).settings.operator_token.get_secret_value()
    return hmac.compare_digest(token.encode(), expected.encode())


def _identify(request: Request, token: str) -> Credential | str | None:
    if is_operator(request, token):
        return OPERATOR
    return state(request).store.credential(token_hash(token))


def _refusing(request: Request, found: Credential | str | None) -> None:
    """A program key refused on an endpoint for another credential is still the key that was
    presented: a flagged one gets its rotation headers and warning on the refusal too (CONTRACT
    section 3: every response to a request authenticated with that key, success or error)."""
    if isinstance(found, Credential) and found.kind == "program":
        remember(request, credential=found)


def _required(request: Request) -> str:
    token = bearer(request)
    if token is None:
        raise MissingCredentials("this endpoint needs an Authorization: Bearer header")
    return token


# -- program keys (track endpoints) -------------------------------------------------------------
def program_from_key(request: Request, token: str) -> Program:
    if is_operator(request, token):
        raise ProgramKeyRequired("track endpoints need a program API key, not an operator token")
    looked_up = state(request).store.credential_and_program(token_hash(token))  # one lookup
    if looked_up is None:
        raise InvalidApiKey("the API key matches no program (unknown, or replaced by regeneration)")
    found, program = looked_up
    if found.kind != "program":
        raise ProgramKeyRequired(f"track endpoints need a program API key, not an {found.kind} credential")
    remember(request, credential=found)
    if program is None:
        raise InvalidApiKey("the API key matches no program")
    remember(request, program_id=program.program_id)
    deadline = found.rotation_deadline
    if deadline is not None and utcnow() >= deadline:
        raise ApiKeyRotationRequired(
            f"this API key was due for rotation by {rfc3339(deadline)}; regenerate it",
            deadline=rfc3339(deadline),
        )
    remember(request, authenticated=True)  # a refusal from here on is the tenant's own
    return program


def require_program_key(request: Request) -> Program:
    return program_from_key(request, _required(request))


# -- account tokens -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Account:
    account_id: str
    roles: dict[str, Role]

    @property
    def workspace_ids(self) -> set[str]:
        return set(self.roles)


def account_id_for_token(store: Store, token: str) -> str | None:
    """The account an account token (`acct_...`) belongs to; None for anything else. Shared by
    the bearer-token API and the dashboard's login form."""
    if not token or len(token) > 512:
        return None
    cred = store.credential(token_hash(token))
    if cred is None or cred.kind != "account":
        return None
    return cred.subject_id


def require_account(request: Request) -> Account:
    token = _required(request)
    account_id = account_id_for_token(state(request).store, token)
    if account_id is None:
        if len(token) <= 512:
            _refusing(request, state(request).store.credential(token_hash(token)))
        raise AccountTokenRequired("this endpoint needs an account token (acct_...) of an existing account")
    return Account(account_id, state(request).store.workspaces_of(account_id))


def account_program(request: Request, account: Account) -> Program:
    program = state(request).store.program(request.path_params["program_id"])
    if program is None or program.workspace_id not in account.workspace_ids:
        raise ProgramNotFound(f"program {request.path_params['program_id']} not found")
    return program


# -- agent keys ---------------------------------------------------------------------------------
def require_agent(request: Request, scope: str) -> Credential:
    found = _identify(request, _required(request))
    if not isinstance(found, Credential) or found.kind != "agent":
        _refusing(request, found)
        what = "unknown" if found is None else "not an agent key"
        raise AgentKeyRequired(f"agent endpoints need an agent key (agt_...); this credential is {what}")
    if scope not in found.scopes:
        raise InsufficientScope(f"this agent key lacks the scope {scope}", required_scope=scope)
    return found


# -- operator ----------------------------------------------------------------------------------
def require_operator(request: Request) -> None:
    token = _required(request)
    if not is_operator(request, token):
        if len(token) <= 512:
            _refusing(request, state(request).store.credential(token_hash(token)))
        raise OperatorTokenRequired("operator endpoints need the operator token (TALLY_OPERATOR_TOKEN)")
