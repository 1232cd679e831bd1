"""Partners' side of a program (CONTRACT 14): promotion codes assigned to them, where they are
paid, and one-time links that sign them in to their portal.

- A promo-code assignment is an owner action in the raw log (ingest/actions.py `promo_code_row`):
  the reconciler reads it like the other owner facts, so attribution stays a function of the log
  whatever order rows arrive in. Its code and processor id are claimed in the program
  (ingest/domain/keys.py `promo_claims`), so a code belongs to one partner at most, decided by
  the database on every backend.
- Payout details and sign-in links are control-plane rows (`Store` as a `Portal`): a link's token
  is shown once (in the answer, or in the email) and stored as its hash; using it takes it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ingest import actions
from ingest.domain.clock import utcnow
from ingest.domain.errors import Conflict, ValidationFailed
from ingest.domain.inputs import PartnerPatch, PayoutDetailsIn, PromoCodeIn
from ingest.domain.keys import promo_claims
from ingest.domain.records import Partner, PayoutDetails, PortalLink, Program
from ingest.domain.tokens import new_token, token_hash
from ingest.storage.contract import Needs, Reader, Store, Tx
from ingest.writer import Writer

LINK_TTL = timedelta(days=7)
LINK_PREFIX = "ptl_"
PAYOUT_FIELDS = ("payout_method", "payout_email", "payout_name", "payout_currency")


# -- promo codes -------------------------------------------------------------------------------
def promo_view(program_id: str, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "program_id": program_id,
        "partner_code": row["partner_code"],
        "code": row["promo_code"],
        "promotion_code_id": row["object_id"],
        "created_at": row["received_at"],
    }


async def assign_promo_code(
    writer: Writer, program: Program, partner: Partner, inp: PromoCodeIn, actor: str
) -> dict[str, Any]:
    """Append the assignment of `inp`'s code (and processor id) to `partner`; Conflict when the
    program gave either to a partner already (this one included)."""
    pid = program.program_id
    row = actions.promo_code_row(program, partner.code, inp.code, inp.promotion_code_id, actor)
    keys = promo_claims(inp.code, inp.promotion_code_id)

    def op(tx: Tx) -> None:
        seq = tx.append(row)
        claimed = tx.claim_keys(pid, keys, seq)
        taken = [k for k in keys if k not in claimed]
        if taken:
            what = " and ".join(k.split(":", 1)[1] for k in taken)
            raise Conflict(f"promo code {what} is assigned to a partner of program {pid} already")

    await writer.run(op, flush=True, needs=Needs(claims=tuple((pid, k) for k in keys)))
    return promo_view(pid, row)


def promo_codes(db: Reader, program_id: str, partner_code: str | None = None) -> list[dict[str, Any]]:
    """The program's promo codes (of one partner, if given), in the order they were assigned."""
    where = " AND partner_code = ?" if partner_code is not None else ""
    rows = db.dicts(
        "SELECT partner_code, promo_code, object_id, received_at FROM raw_events"
        f" WHERE program_id = ? AND kind = ? AND outcome = 'accepted'{where} ORDER BY seq",
        [program_id, actions.PROMO_CODE, *([partner_code] if partner_code is not None else [])],
    )
    return [promo_view(program_id, row) for row in rows]


# -- payout details ----------------------------------------------------------------------------
def payout_view(details: PayoutDetails | None) -> dict[str, Any]:
    """A partner's payout details as reads show them (every field null when none are set)."""
    if details is None:
        return dict.fromkeys(PAYOUT_FIELDS)
    return {
        "payout_method": details.method,
        "payout_email": details.email,
        "payout_name": details.name,
        "payout_currency": details.currency,
    }


def set_payout_details(
    store: Store, program_id: str, partner_code: str, inp: PayoutDetailsIn, by: str
) -> PayoutDetails:
    details = PayoutDetails(
        program_id,
        partner_code,
        inp.payout_method,
        inp.payout_email,
        inp.payout_name,
        inp.payout_currency,
        utcnow(),
        by,
    )
    store.set_payout_details(details)
    return details


def patch_payout_details(
    store: Store, program: Program, partner: Partner, inp: PartnerPatch, by: str
) -> PayoutDetails:
    """An owner's PATCH: the fields sent over what was set; ValidationFailed naming each field
    still missing (a first PATCH sends all four)."""
    current = payout_view(store.payout_details(program.program_id).get(partner.code))
    merged = {**current, **inp.model_dump(exclude_unset=True)}
    missing = [name for name in PAYOUT_FIELDS if merged.get(name) is None]
    if missing:
        raise ValidationFailed(
            f"partner {partner.code}'s payout details need {', '.join(missing)}",
            fields=[{"field": name, "message": "required (no value set yet)"} for name in missing],
        )
    return set_payout_details(store, program.program_id, partner.code, PayoutDetailsIn(**merged), by)


# -- sign-in links -----------------------------------------------------------------------------
def new_portal_link(store: Store, program: Program, partner: Partner, actor: str) -> tuple[str, PortalLink]:
    """A new one-time sign-in token for `partner` (shown once: only its hash is kept), valid for
    LINK_TTL, and its stored record."""
    token = new_token(LINK_PREFIX)
    now = utcnow()
    link = PortalLink(token_hash(token), program.program_id, partner.code, now, now + LINK_TTL, actor)
    store.add_portal_link(link)
    return token, link


def use_portal_link(store: Store, token: str, now: datetime | None = None) -> PortalLink | None:
    """The link `token` opens, taken (no second use, on any replica); None when unknown, used or
    expired, or when its partner no longer exists."""
    if not token.startswith(LINK_PREFIX) or len(token) > 100:
        return None
    link = store.use_portal_link(token_hash(token), now or utcnow())
    if link is None or store.partner(link.program_id, link.partner_code) is None:
        return None
    return link
