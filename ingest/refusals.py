"""What a refused call leaves in its program's tracking log: a bounded note, never its text.

A refused call is unverified (a webhook delivery whose signature failed, a public click or lead
the program did not take, a call whose key was refused) or refused before it was stored: what
it says is the sender's, and anyone can send 1 MiB of it while naming a program (a processor
account, or a program id, which is public in the browser snippet). So its log line keeps a
note of at most `MAX_NOTE` characters, built only from our own vocabulary and numbers: which
check failed (the error code, and for a signature which part of it), the body's size and
sha256 (so a sender can match it against what it sent), the media type when it is a well-formed
one (else `other`), the names of the known request headers it carried, and, for a webhook, the
event type when the contract names it. An authenticated call (a valid program key)
also keeps the error's own message, cut to `MAX_MESSAGE` characters: the tenant's own words.

Nothing else of a refused call is stored: it never becomes a raw-log row.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MAX_NOTE = 512  # characters of a refusal's tracking-log detail, whatever the request held
MAX_MESSAGE = 200  # characters of an authenticated call's error message kept in the note

# Header names a note may name (those present on the request): a fixed list, so a sender's
# own header names never reach the log.
KNOWN_HEADERS = (
    "authorization",
    "content-type",
    "origin",
    "referer",
    "stripe-signature",
    "user-agent",
    "x-forwarded-for",
    "x-request-id",
)
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,31}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}")


def media_type(content_type: str | None) -> str:
    """The request's media type (`application/json`, parameters dropped) when well formed and
    short; `none` without the header, `other` for anything else."""
    if content_type is None:
        return "none"
    value = content_type.split(";", 1)[0].strip().lower()
    return value if _MEDIA_TYPE.fullmatch(value) else "other"


def note(
    check: str,
    body: bytes | None,
    content_type: str | None,
    header_names: Iterable[str],
    *,
    event: str | None = None,
    message: str | None = None,
) -> str:
    """The tracking-log detail of one refused call (at most `MAX_NOTE` characters).

    `check` is ours (an error code, maybe with the part that failed); `body` None when the call
    was refused before its body was read; `event` only from a closed list the caller checked;
    `message` only for an authenticated call."""
    parts = [f"refused ({check[:64]})"]
    if event is not None:
        parts.append(event[:64])
    if body is None:
        parts.append("body not read")
    else:
        parts.append(f"{len(body)}-byte body sha256 {hashlib.sha256(body).hexdigest()}")
    parts.append(f"content-type {media_type(content_type)}")
    present = sorted({n.lower() for n in header_names} & set(KNOWN_HEADERS))
    parts.append(f"headers {','.join(present) or 'none'}")
    if message:
        cut = message[:MAX_MESSAGE] + ("..." if len(message) > MAX_MESSAGE else "")
        parts.append(cut)
    return "; ".join(parts)[:MAX_NOTE]
