"""Dashboard sessions and CSRF protection.

A login exchanges an account token for a random session id in an `HttpOnly; SameSite=Lax;
Path=/dashboard` cookie (`Secure` when `TALLY_BASE_URL` is https). The token itself is never kept:
not in the cookie, not in a page, not in memory. Sessions live in the database (`SessionStore`):
a restart keeps people logged in; they end at logout or after `SESSION_TTL`. They are keyed by
the hash of the session id, so the database holds no usable cookie value. A newly generated
program key waits for the single page that shows it after the regenerate POST's redirect
(`show_once`/`take_once`) in the database too, so any replica may serve that page: sealed with
AES-GCM under a key derived from the session id (which only the browser's cookie holds), taken
in one step by that page, dropped after `ONCE_TTL` or at logout.

Every session has its own CSRF token, sent in a hidden field of every dashboard form; every
dashboard POST compares it in constant time and, when the browser sent `Origin` or `Referer`,
also requires our own origin. The login form, which has no session yet, uses a double-submit
cookie (`LOGIN_CSRF_COOKIE`), so a forged login is refused too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from starlette.requests import Request
from starlette.responses import Response

from ingest.domain.clock import utcnow
from ingest.domain.records import StoredSession
from ingest.domain.tokens import token_hash
from ingest.storage.contract import Store

SESSION_COOKIE = "tally_session"
LOGIN_CSRF_COOKIE = "tally_login_csrf"
CSRF_FIELD = "csrf_token"
SESSION_TTL = timedelta(hours=12)
# A value shown once on the page after a redirect (a new API key): how long it waits to be shown.
ONCE_TTL = timedelta(minutes=5)
LOGIN_CSRF_TTL = timedelta(hours=2)
DASHBOARD_PATH = "/dashboard"
LOGIN_PATH = "/dashboard/login"


class LoginRequired(Exception):
    """Raised by `current_session` when the request has no live dashboard session."""


class CsrfRefused(Exception):
    """Raised by the CSRF checks when a dashboard POST lacks our token or comes from elsewhere."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Session:
    account_id: str
    csrf_token: str
    expires_at: datetime


class SessionStore:
    """Dashboard sessions, kept in the database by the hash of their id (`Store.save_session`):
    a restart, or another process on the same database, keeps them; logout and expiry end them
    everywhere. Expired ones are swept at each login. Nothing of them is kept in this process."""

    def __init__(self, store: Store, ttl: timedelta = SESSION_TTL) -> None:
        self.store = store
        self._ttl = ttl

    def create(self, account_id: str) -> tuple[str, Session]:
        """A new session for `account_id`: the id for the cookie, and the session."""
        session_id = secrets.token_urlsafe(32)
        now = utcnow()
        session = Session(account_id, secrets.token_urlsafe(32), now + self._ttl)
        key = token_hash(session_id)
        self.store.save_session(StoredSession(key, account_id, session.csrf_token, now, session.expires_at))
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        found = self.store.load_session(token_hash(session_id), utcnow())
        return None if found is None else Session(found.account_id, found.csrf_token, found.expires_at)

    def end(self, session_id: str) -> None:
        self.store.end_session(token_hash(session_id))

    def show_once(self, session_id: str, name: str, value: str) -> None:
        """Keep `value` for the session's next page that asks for `name` (post-redirect-get),
        sealed with the session id (see the module docstring)."""
        key = token_hash(session_id)
        sealed = _seal(session_id, f"{key}:{name}", value)
        now = utcnow()
        self.store.keep_once(key, name, sealed, now, now + ONCE_TTL)

    def take_once(self, session_id: str, name: str) -> str | None:
        """The value kept under `name`, removed: a second call (a reload, on any replica) gets None."""
        key = token_hash(session_id)
        sealed = self.store.take_once(key, name, utcnow())
        return None if sealed is None else _unseal(session_id, f"{key}:{name}", sealed)


def _cipher(session_id: str) -> AESGCM:
    return AESGCM(hmac.new(session_id.encode(), b"tally shown-once value", hashlib.sha256).digest())


def _seal(session_id: str, context: str, value: str) -> str:
    nonce = secrets.token_bytes(12)
    sealed = _cipher(session_id).encrypt(nonce, value.encode(), context.encode())
    return base64.b64encode(nonce + sealed).decode()


def _unseal(session_id: str, context: str, sealed: str) -> str | None:
    raw = base64.b64decode(sealed)
    try:
        return _cipher(session_id).decrypt(raw[:12], raw[12:], context.encode()).decode()
    except InvalidTag:  # not sealed for this session
        return None


def sessions(request: Request) -> SessionStore:
    """The app's session store over its database (made with the app's first dashboard request)."""
    store = request.app.state.tally.store
    found: SessionStore | None = getattr(request.app.state, "dashboard_sessions", None)
    if found is None or found.store is not store:  # new, or the app was started again
        found = request.app.state.dashboard_sessions = SessionStore(store)
    return found


# -- cookies -----------------------------------------------------------------------------------
def _secure(request: Request) -> bool:
    base_url: str = request.app.state.tally.settings.base_url
    return base_url.startswith("https://")


def current_session(request: Request) -> tuple[str, Session]:
    session_id = request.cookies.get(SESSION_COOKIE)
    session = sessions(request).get(session_id) if session_id else None
    if session_id is None or session is None:
        raise LoginRequired
    return session_id, session


def set_session_cookie(request: Request, response: Response, session_id: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=int(SESSION_TTL.total_seconds()),
        path=DASHBOARD_PATH,
        secure=_secure(request),
        httponly=True,
        samesite="lax",
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE, path=DASHBOARD_PATH, secure=_secure(request), httponly=True, samesite="lax"
    )


def login_csrf_token(request: Request) -> str:
    """The pre-session CSRF token: the browser's cookie when it has a sane one, else a new one."""
    existing = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    return existing if 32 <= len(existing) <= 64 and existing.isascii() else secrets.token_urlsafe(32)


def set_login_csrf_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        token,
        max_age=int(LOGIN_CSRF_TTL.total_seconds()),
        path=LOGIN_PATH,
        secure=_secure(request),
        httponly=True,
        samesite="strict",
    )


def clear_login_csrf_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        LOGIN_CSRF_COOKIE, path=LOGIN_PATH, secure=_secure(request), httponly=True, samesite="strict"
    )


# -- CSRF ----------------------------------------------------------------------------
def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_origin(request: Request) -> None:
    """When the browser says where a POST comes from, it must be this site."""
    ours = {_origin(request.app.state.tally.settings.base_url)}
    host = request.headers.get("host")
    if host:
        ours.add(f"{request.url.scheme}://{host}".lower())
    origin = request.headers.get("origin")
    if origin is not None:
        if origin.lower() not in ours:
            raise CsrfRefused("this form was posted from another site (Origin)")
        return
    referer = request.headers.get("referer")
    if referer is not None and _origin(referer) not in ours:
        raise CsrfRefused("this form was posted from another site (Referer)")


def same_token(sent: str, expected: str) -> bool:
    """Whether a form's CSRF token is the expected one (constant time; empty never matches)."""
    return bool(sent) and bool(expected) and hmac.compare_digest(sent.encode(), expected.encode())


def check_csrf(request: Request, session: Session, form: dict[str, str]) -> None:
    check_origin(request)
    if not same_token(form.get(CSRF_FIELD, ""), session.csrf_token):
        raise CsrfRefused("the form's CSRF token is missing or wrong; reload the page and try again")


def check_login_csrf(request: Request, form: dict[str, str]) -> None:
    check_origin(request)
    if not same_token(form.get(CSRF_FIELD, ""), request.cookies.get(LOGIN_CSRF_COOKIE, "")):
        raise CsrfRefused("the login form expired or was not ours; reload the login page")
