"""The partners' portal: who is signed in, their sessions and CSRF (CONTRACT 14).

A partner signs in with a one-time link an owner made (ingest/partners.py): the link's page asks
them to press "Sign in" (a POST, so a mail scanner that opens links never uses one up), which
takes the link and opens a session: a random id in an `HttpOnly; SameSite=Lax; Path=/partner`
cookie (`Secure` when `TALLY_BASE_URL` is https), kept in the database by its hash like the
dashboard's sessions (api/session.py), so every replica knows it and a restart keeps it. Every
portal form carries the session's CSRF token and is checked as the dashboard's are (the
same-origin check included); the sign-in form, which has no session yet, uses a double-submit
cookie of its own, scoped to the sign-in path.

Who the partner is: the partner the link was made for, and every partner of the other programs
of the same workspace (the brand) whose email is that partner's (without case): a partner in
several programs of one brand sees each. A page about any other program, partner or batch is
404, whatever exists (nothing is said about it).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response

from api.session import CSRF_FIELD, CsrfRefused, LoginRequired, check_origin, same_token
from ingest.domain.clock import utcnow
from ingest.domain.errors import NotFound
from ingest.domain.records import Partner, PartnerSession, PortalLink, Program
from ingest.domain.tokens import token_hash
from ingest.storage.contract import Store

PORTAL_PATH = "/partner"
SIGN_IN_PATH = "/partner/sign-in"
PORTAL_COOKIE = "tally_partner"
SIGN_IN_CSRF_COOKIE = "tally_partner_sign_in"
SESSION_TTL = timedelta(days=7)
SIGN_IN_CSRF_TTL = timedelta(hours=2)


@dataclass(frozen=True)
class Membership:
    """One program the partner belongs to, and their partner record in it."""

    program: Program
    partner: Partner


@dataclass(frozen=True)
class PartnerViewer:
    """The signed-in partner: their session (id and CSRF token) and every program they are in."""

    session_id: str
    session: PartnerSession
    memberships: tuple[Membership, ...]

    @property
    def csrf_token(self) -> str:
        return self.session.csrf_token

    @property
    def name(self) -> str:
        return self.memberships[0].partner.name if self.memberships else ""

    def membership(self, program_id: str) -> Membership:
        """The partner's place in `program_id`; NotFound for any program that is not theirs."""
        for found in self.memberships:
            if found.program.program_id == program_id:
                return found
        raise NotFound("no such page")


def memberships(store: Store, program_id: str, partner_code: str) -> tuple[Membership, ...]:
    """The partner the session was opened for, first, then the partners of the brand's other
    programs with the same email (see the module docstring); empty when it no longer exists."""
    program = store.program(program_id)
    partner = store.partner(program_id, partner_code) if program is not None else None
    if program is None or partner is None:
        return ()
    found = [Membership(program, partner)]
    email = (partner.email or "").strip().lower()
    if email:
        for other in sorted(store.programs_in([program.workspace_id]), key=lambda p: (p.name, p.program_id)):
            if other.program_id == program_id:
                continue
            for candidate in store.partners(other.program_id):
                if (candidate.email or "").strip().lower() == email:
                    found.append(Membership(other, candidate))
                    break
    return tuple(found)


def open_session(store: Store, link: PortalLink) -> tuple[str, PartnerSession]:
    """A new session for the partner `link` was made for: the id for the cookie, and the session."""
    session_id = secrets.token_urlsafe(32)
    now = utcnow()
    session = PartnerSession(
        token_hash(session_id),
        link.program_id,
        link.partner_code,
        secrets.token_urlsafe(32),
        now,
        now + SESSION_TTL,
    )
    store.save_partner_session(session)
    return session_id, session


def current(request: Request, store: Store, now: datetime | None = None) -> PartnerViewer:
    """The signed-in partner; LoginRequired without a live session (or when their partner record
    is gone)."""
    session_id = request.cookies.get(PORTAL_COOKIE)
    session = store.load_partner_session(token_hash(session_id), now or utcnow()) if session_id else None
    if session_id is None or session is None:
        raise LoginRequired
    found = memberships(store, session.program_id, session.partner_code)
    if not found:
        raise LoginRequired
    return PartnerViewer(session_id, session, found)


def _secure(request: Request) -> bool:
    base_url: str = request.app.state.tally.settings.base_url
    return base_url.startswith("https://")


def set_session_cookie(request: Request, response: Response, session_id: str) -> None:
    response.set_cookie(
        PORTAL_COOKIE,
        session_id,
        max_age=int(SESSION_TTL.total_seconds()),
        path=PORTAL_PATH,
        secure=_secure(request),
        httponly=True,
        samesite="lax",
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        PORTAL_COOKIE, path=PORTAL_PATH, secure=_secure(request), httponly=True, samesite="lax"
    )


def sign_in_csrf_token(request: Request) -> str:
    existing = request.cookies.get(SIGN_IN_CSRF_COOKIE, "")
    return existing if 32 <= len(existing) <= 64 and existing.isascii() else secrets.token_urlsafe(32)


def set_sign_in_csrf_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        SIGN_IN_CSRF_COOKIE,
        token,
        max_age=int(SIGN_IN_CSRF_TTL.total_seconds()),
        path=SIGN_IN_PATH,
        secure=_secure(request),
        httponly=True,
        samesite="strict",
    )


def clear_sign_in_csrf_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        SIGN_IN_CSRF_COOKIE, path=SIGN_IN_PATH, secure=_secure(request), httponly=True, samesite="strict"
    )


def check_csrf(request: Request, viewer: PartnerViewer, form: dict[str, str]) -> None:
    check_origin(request)
    if not same_token(form.get(CSRF_FIELD, ""), viewer.csrf_token):
        raise CsrfRefused("the form's CSRF token is missing or wrong; reload the page and try again")


def check_sign_in_csrf(request: Request, form: dict[str, str]) -> None:
    check_origin(request)
    if not same_token(form.get(CSRF_FIELD, ""), request.cookies.get(SIGN_IN_CSRF_COOKIE, "")):
        raise CsrfRefused("the sign-in form expired or was not ours; open your sign-in link again")
