"""A small, obviously-correct reference reconciler: plain Python, dicts and loops.

Written straight from the rules in the reconcile/ module docstrings (and SEED.md / CONTRACT.md
section 7), one rule at a time, with no cleverness: the attribution ladder walks the sales in
their total order and remembers attributed customers as it goes; refunds are applied one by one.
The real, vectorised reconciler must agree with it exactly.
"""

from __future__ import annotations

import calendar
import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from reconcile.terms import TERMS  # the names of the terms alone; the rules are restated here

Row = dict[str, Any]

SESSION_EVENTS = {"checkout.session.completed", "checkout.session.async_payment_succeeded"}
INVOICE_EVENTS = {"invoice.payment_succeeded", "invoice.paid"}
RECURRING_REASONS = {"subscription_cycle", "subscription_update", "subscription_threshold"}
ID_FIELDS = ["invoice_id", "payment_intent_id", "checkout_session_id", "charge_id"]
VALUES = ["amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded"]
DEFAULTS: dict[str, Any] = {
    "commission_type": "percent",
    "commission_bps": 3000,
    "commission_flat": 0,
    "recurring_months": None,
    "platform_fee_bps": 0,
    "holding_days": 30,
}


# --- small helpers ---------------------------------------------------------------------------


def round_half_even(numerator: int, denominator: int) -> int:
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def add_months(moment: datetime, months: int) -> datetime:
    index = moment.month - 1 + months
    year, month = moment.year + index // 12, index % 12 + 1
    day = min(moment.day, calendar.monthrange(year, month)[1])
    return moment.replace(year=year, month=month, day=day)


def norm_email(email: str | None) -> str | None:
    if email is None:
        return None
    cleaned = email.strip().lower()
    return cleaned or None


def first(values: Iterable[Any]) -> Any:
    for value in values:
        if value is not None:
            return value
    return None


def period(moment: datetime) -> str:
    return moment.strftime("%Y-%m")


def is_test(r: Row) -> bool:
    return bool(r["test_mode"]) or r["livemode"] is False


def accepted(rows: list[Row], kind: str) -> list[Row]:
    return [
        r
        for r in rows
        if r["kind"] == kind
        and r["outcome"] == "accepted"
        and r["program_id"] is not None
        and r["event_id"] is not None
    ]


def by_time(r: Row) -> tuple[datetime, str]:
    return (r["occurred_at"], r["event_id"])


# --- normalisation ---------------------------------------------------------------------------


def stripe_events(rows: list[Row]) -> list[Row]:
    seen: dict[tuple[str, str], Row] = {}
    for r in accepted(rows, "stripe"):
        seen.setdefault((r["program_id"], r["event_id"]), r)
    return list(seen.values())


def connect_sales(events: list[Row]) -> list[Row]:
    records = []
    for r in events:
        if r["event_type"] in SESSION_EVENTS and r["checkout_mode"] in ("payment", "subscription"):
            session_id = coalesce(r["object_id"], r["checkout_session_id"])
            records.append({**r, "is_session": True, "checkout_session_id": session_id})
        elif r["event_type"] in INVOICE_EVENTS:
            records.append(
                {**r, "is_session": False, "invoice_id": coalesce(r["object_id"], r["invoice_id"])}
            )
    create_invoice: dict[tuple[str, str], str] = {}
    for r in records:
        if not r["is_session"] and r["billing_reason"] == "subscription_create" and r["subscription_id"]:
            key = (r["program_id"], r["subscription_id"])
            if r["invoice_id"] is not None and (
                key not in create_invoice or r["invoice_id"] < create_invoice[key]
            ):
                create_invoice[key] = r["invoice_id"]
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in records:
        if not r["is_session"] or r["invoice_id"] is not None:
            sale_key = r["invoice_id"]
        elif (
            r["checkout_mode"] == "subscription" and (r["program_id"], r["subscription_id"]) in create_invoice
        ):
            sale_key = create_invoice[(r["program_id"], r["subscription_id"])]
        else:
            sale_key = r["checkout_session_id"]
        if sale_key is not None:
            groups[(r["program_id"], sale_key)].append(r)
    sales = []
    for (program_id, sale_key), group in groups.items():
        group.sort(key=by_time)
        sessions = [r for r in group if r["is_session"]]
        invoices = [r for r in group if not r["is_session"]]
        s = sessions[0] if sessions else dict.fromkeys(group[0])
        i = invoices[0] if invoices else dict.fromkeys(group[0])
        side = i if invoices else s  # amounts
        meta = s if sessions else i  # attribution metadata
        gross = side["amount"]
        if gross is None or gross <= 0:
            continue
        tax = side["tax"] or 0
        subscription_id = coalesce(i["subscription_id"], s["subscription_id"])
        if sessions:
            metadata_source = "checkout_session"
        elif subscription_id is not None:
            metadata_source = "subscription"
        else:
            metadata_source = "invoice"
        ids = {
            "invoice_id": coalesce(i["invoice_id"], s["invoice_id"]),
            "payment_intent_id": coalesce(i["payment_intent_id"], s["payment_intent_id"]),
            "checkout_session_id": coalesce(s["checkout_session_id"], i["checkout_session_id"]),
            "charge_id": coalesce(i["charge_id"], s["charge_id"]),
        }
        sales.append(
            {
                "program_id": program_id,
                "sale_id": sale_key,
                "transaction_id": coalesce(
                    ids["invoice_id"], ids["payment_intent_id"], ids["checkout_session_id"]
                ),
                "source": "connect",
                "amount": max(gross - tax, 0),
                "gross_amount": gross,
                "tax": tax,
                "currency": coalesce(i["currency"], s["currency"]) if invoices else s["currency"],
                "is_recurring": not sessions and i["billing_reason"] in RECURRING_REASONS,
                "test_mode": any(is_test(r) for r in group),
                "customer_key": meta["customer_key"],
                "processor_customer_id": coalesce(s["processor_customer_id"], i["processor_customer_id"]),
                "email": coalesce(s["email"], i["email"]),
                "click_id": meta["click_id"],
                "meta_program_id": meta["meta_program_id"],
                "metadata_source": metadata_source,
                "metadata_missing": metadata_source == "subscription" and not i["sub_metadata_present"],
                "subscription_id": subscription_id,
                **ids,
                "occurred_at": min(r["occurred_at"] for r in group),
                "promo_code": s["promo_code"] if sessions else None,  # the checkout's promotion code
                "record_ids": list(dict.fromkeys(r["event_id"] for r in group)),
            }
        )
    return sales


def self_hosted_sales(rows: list[Row]) -> list[Row]:
    sales = []
    for r in accepted(rows, "sale"):
        if r["source"] != "track":
            continue
        test = is_test(r)
        if not test and not (r["amount"] is not None and r["amount"] > 0):
            continue
        gross = r["amount"] or 0
        tax = r["tax"] or 0
        sales.append(
            {
                "program_id": r["program_id"],
                "sale_id": r["event_id"],
                "transaction_id": r["transaction_id"],
                "source": "self_hosted",
                "amount": max(gross - tax, 0),
                "gross_amount": gross,
                "tax": tax,
                "currency": r["currency"] or "usd",
                "is_recurring": bool(r["is_recurring"]),
                "test_mode": test,
                "customer_key": r["customer_key"],
                "processor_customer_id": r["processor_customer_id"],
                "email": r["email"],
                "click_id": r["click_id"],
                "meta_program_id": r["meta_program_id"],
                "metadata_source": "track",
                "metadata_missing": False,
                "subscription_id": r["subscription_id"],
                **dict.fromkeys(ID_FIELDS),
                "occurred_at": r["occurred_at"],
                "promo_code": r["promo_code"],  # the code the customer typed
                "record_ids": [r["event_id"]],
            }
        )
    return sales


# --- double counting -------------------------------------------------------------------------


def build_id_map(connect: list[Row], self_hosted: list[Row]) -> dict[tuple[str, str], tuple[str, str]]:
    """(program, id) -> (sale_id, matched_on): connect ids by field rank, then self-hosted."""
    best: dict[tuple[str, str], tuple[int, str, str]] = {}
    for rank, field in enumerate(ID_FIELDS):
        for s in connect:
            if s[field] is not None:
                key = (s["program_id"], s[field])
                if key not in best or (rank, s["sale_id"]) < best[key][:2]:
                    best[key] = (rank, s["sale_id"], field)
    for s in self_hosted:
        if s["transaction_id"] is not None:
            key = (s["program_id"], s["transaction_id"])
            rank = len(ID_FIELDS) + (1 if s["test_mode"] else 0)
            if key not in best or (rank, s["sale_id"]) < best[key][:2]:
                best[key] = (rank, s["sale_id"], "transaction_id")
    return {k: (v[1], v[2]) for k, v in best.items()}


def split_doubles(connect: list[Row], self_hosted: list[Row]) -> tuple[list[Row], list[Row]]:
    connect_ids = build_id_map(connect, [])
    by_id = {(s["program_id"], s["sale_id"]): s for s in connect}
    counted, report = [], []
    for s in self_hosted:
        hit = connect_ids.get((s["program_id"], s["transaction_id"]))
        if not s["test_mode"] and s["transaction_id"] is not None and hit is not None:
            winner = by_id[(s["program_id"], hit[0])]
            report.append(
                {
                    "program_id": s["program_id"],
                    "kind": "connect_and_self_hosted",
                    "transaction_id": winner["transaction_id"],
                    "sale_id": winner["sale_id"],
                    "connect_record_ids": winner["record_ids"],
                    "duplicate_id": s["sale_id"],
                    "duplicate_transaction_id": s["transaction_id"],
                    "matched_on": hit[1],
                    "amount": s["gross_amount"],
                    "currency": s["currency"],
                    "occurred_at": s["occurred_at"],
                }
            )
        else:
            counted.append(s)
    firsts: dict[tuple[str, str], Row] = {}
    for s in counted:
        if not s["test_mode"] and s["transaction_id"] is not None:
            key = (s["program_id"], s["transaction_id"])
            if key not in firsts or (s["occurred_at"], s["sale_id"]) < (
                firsts[key]["occurred_at"],
                firsts[key]["sale_id"],
            ):
                firsts[key] = s
    kept = []
    for s in counted:
        first_sale = firsts.get((s["program_id"], s["transaction_id"])) if not s["test_mode"] else None
        if first_sale is not None and first_sale is not s:
            report.append(
                {
                    "program_id": s["program_id"],
                    "kind": "self_hosted_repeat",
                    "transaction_id": s["transaction_id"],
                    "sale_id": first_sale["sale_id"],
                    "connect_record_ids": None,
                    "duplicate_id": s["sale_id"],
                    "duplicate_transaction_id": s["transaction_id"],
                    "matched_on": "transaction_id",
                    "amount": s["gross_amount"],
                    "currency": s["currency"],
                    "occurred_at": s["occurred_at"],
                }
            )
        else:
            kept.append(s)
    return kept, report


def refused_duplicates(rows: list[Row], ids: dict[tuple[str, str], tuple[str, str]]) -> list[Row]:
    out = []
    for r in rows:
        if r["kind"] == "sale" and r["outcome"] == "duplicate":
            hit = ids.get((r["program_id"], r["transaction_id"]))
            out.append(
                {
                    "program_id": r["program_id"],
                    "kind": "ingest_refused",
                    "transaction_id": r["transaction_id"],
                    "sale_id": hit[0] if hit else None,
                    "connect_record_ids": None,
                    "duplicate_id": r["event_id"],
                    "duplicate_transaction_id": r["transaction_id"],
                    "matched_on": hit[1] if hit else None,
                    "amount": r["amount"],
                    "currency": r["currency"],
                    "occurred_at": r["occurred_at"],
                }
            )
    return out


def uncounted_partners(
    rows: list[Row],
    doubles: list[Row],
    clicks: dict[tuple[str, str], str],
    leads: list[Row],
    promos: dict[tuple[str, str], str],
) -> dict[tuple[str, str], str | None]:
    """(program, duplicate id) -> the partner the record that was not counted names on its own:
    the ladder on the record as it came, without its processor customer."""
    paired = {(d["program_id"], d["duplicate_id"]) for d in doubles if d["kind"] != "ingest_refused"}
    records = [
        {**s, "processor_customer_id": None}
        for s in self_hosted_sales(rows)
        if (s["program_id"], s["sale_id"]) in paired
    ]
    for r in rows:
        if (
            r["kind"] == "sale"
            and r["outcome"] == "duplicate"
            and r["program_id"] is not None
            and r["event_id"] is not None
        ):
            records.append(
                {
                    "program_id": r["program_id"],
                    "sale_id": r["event_id"],
                    "occurred_at": r["occurred_at"],
                    "test_mode": is_test(r),
                    "click_id": r["click_id"],
                    "customer_key": r["customer_key"],
                    "email": r["email"],
                    "promo_code": r["promo_code"],
                    "source": "self_hosted",
                    "processor_customer_id": None,
                    "meta_program_id": r["meta_program_id"],
                    "metadata_missing": False,
                }
            )
    attribute(records, clicks, leads, promos)
    return {(s["program_id"], s["sale_id"]): s["partner_code"] for s in records}


def finish_doubles(
    doubles: list[Row], sales: list[Row], named: dict[tuple[str, str], str | None]
) -> list[Row]:
    """Each line with the partner each record named, and each sale's money on its first line."""
    partner_of = {(s["program_id"], s["sale_id"]): s["partner_code"] for s in sales}

    def nulls_last(value: Any) -> tuple[bool, Any]:
        return (value is None, value if value is not None else "")

    ordered = sorted(
        doubles,
        key=lambda d: tuple(
            nulls_last(d[c]) for c in ("program_id", "occurred_at", "kind", "transaction_id", "duplicate_id")
        ),
    )
    seen: set[tuple[Any, ...]] = set()
    for d in ordered:
        d["partner_code"] = partner_of.get((d["program_id"], d["sale_id"]))
        d["duplicate_partner_code"] = named.get((d["program_id"], d["duplicate_id"]))
        named_one = d["duplicate_partner_code"]
        d["partner_mismatch"] = named_one is not None and named_one != d["partner_code"]
        if d["sale_id"] is not None:
            sale = (d["program_id"], "sale", d["sale_id"])
        elif d["transaction_id"] is not None:
            sale = (d["program_id"], "transaction", d["transaction_id"])
        else:
            sale = (d["program_id"], "line", d["duplicate_id"])
        d["distinct_amount"] = 0 if sale in seen else (d["amount"] or 0)
        seen.add(sale)
    return ordered


# --- metadata fixes --------------------------------------------------------------------------


def parse_day(body: str | None, name: str) -> date | None:
    try:
        value = json.loads(body or "{}").get(name)
        return date.fromisoformat(str(value)[:10]) if value is not None else None
    except (ValueError, AttributeError):
        return None


def apply_fixes(rows: list[Row], sales: list[Row]) -> None:
    fixes = accepted_engineer(rows, "metadata_fix")
    backfills = []
    for b in accepted_engineer(rows, "backfill"):
        try:
            dry = json.loads(b["body"] or "{}").get("dry_run") is True
        except (ValueError, AttributeError):
            dry = False
        if not dry:
            backfills.append(
                (b["program_id"], b["seq"], parse_day(b["body"], "from"), parse_day(b["body"], "to"))
            )
    for s in sales:
        day = s["occurred_at"].date()
        effective = []
        for f in fixes:
            if f["program_id"] != s["program_id"]:
                continue
            targets = (f["subscription_id"] is not None and f["subscription_id"] == s["subscription_id"]) or (
                f["transaction_id"] is not None and f["transaction_id"] == s["transaction_id"]
            )
            covered = any(
                program == s["program_id"]
                and seq > f["seq"]
                and (start is None or start <= day)
                and (end is None or day <= end)
                for program, seq, start, end in backfills
            )
            if targets and covered:
                effective.append(f)
        effective.sort(key=lambda f: f["seq"], reverse=True)
        fix_click = first(f["click_id"] for f in effective)
        fix_key = first(f["customer_key"] for f in effective)
        s["fixed"] = fix_click is not None or fix_key is not None
        if fix_click is not None:
            s["click_id"] = fix_click
        if fix_key is not None:
            s["customer_key"] = fix_key
        if s["fixed"]:
            s["metadata_missing"] = False


def accepted_engineer(rows: list[Row], kind: str) -> list[Row]:
    return [
        r for r in rows if r["kind"] == kind and r["outcome"] == "accepted" and r["program_id"] is not None
    ]


def coalesce(*values: Any) -> Any:
    return first(values)


# --- clicks and leads ------------------------------------------------------------------------


def click_partners(rows: list[Row]) -> dict[tuple[str, str], str]:
    partners: dict[tuple[str, str], str] = {}
    clicks = [
        r for r in accepted(rows, "click") if r["click_id"] is not None and r["partner_code"] is not None
    ]
    for r in sorted(clicks, key=by_time):
        partners.setdefault((r["program_id"], r["click_id"]), r["partner_code"])
    return partners


def lead_records(rows: list[Row], clicks: dict[tuple[str, str], str]) -> list[Row]:
    leads = [
        {
            "program_id": r["program_id"],
            "lead_id": r["event_id"],
            "customer_key": r["customer_key"],
            "email_norm": norm_email(r["email"]),
            "click_id": r["click_id"],
            "settled": r["lead_status"] == "settled",
            "occurred_at": r["occurred_at"],
        }
        for r in accepted(rows, "lead")
    ]
    for lead in leads:
        lead["click"] = None
        lead["partner"] = None
        if not lead["settled"]:
            continue
        click = lead["click_id"]
        if click is None:
            provisional = sorted(
                (
                    other
                    for other in leads
                    if not other["settled"]
                    and other["program_id"] == lead["program_id"]
                    and other["customer_key"] is not None
                    and other["customer_key"] == lead["customer_key"]
                    and other["click_id"] is not None
                ),
                key=lambda other: (other["occurred_at"], other["lead_id"]),
            )
            if provisional and provisional[0]["occurred_at"] <= lead["occurred_at"]:
                click = provisional[0]["click_id"]
        lead["click"] = click
        lead["partner"] = clicks.get((lead["program_id"], click)) if click is not None else None
    return leads


def lead_lookup(leads: list[Row], program_id: str, field: str, value: str | None) -> dict[str, Any]:
    """The binding (first settled) lead for a customer key or email, and what else exists."""
    if value is None:
        return {"lead": None, "settled": None, "provisional": None}
    mine = [lead for lead in leads if lead["program_id"] == program_id and lead[field] == value]
    if not mine:
        return {"lead": None, "settled": None, "provisional": None}
    settled = sorted(
        (lead for lead in mine if lead["settled"]), key=lambda lead: (lead["occurred_at"], lead["lead_id"])
    )
    return {
        "lead": settled[0] if settled else None,
        "settled": bool(settled),
        "provisional": any(not lead["settled"] for lead in mine),
    }


# --- promo codes (CONTRACT 14) -----------------------------------------------------------------


def promo_partners(rows: list[Row]) -> dict[tuple[str, str], str]:
    """(program, key) -> partner: each code (upper-cased, `promo_code:`) and processor promotion
    code id (`promotion_code:`) names the partner of its first assignment in the log."""
    found: dict[tuple[str, str], str] = {}
    for r in sorted(accepted_engineer(rows, "promo_code"), key=lambda r: r["seq"]):
        if r["partner_code"] is None:
            continue
        if r["promo_code"] is not None:
            found.setdefault((r["program_id"], "promo_code:" + r["promo_code"].upper()), r["partner_code"])
        if r["object_id"] is not None:
            found.setdefault((r["program_id"], "promotion_code:" + r["object_id"]), r["partner_code"])
    return found


def promo_key(s: Row, code: str) -> str:
    """A checkout names the processor's promotion code id; a track sale the code typed."""
    return "promotion_code:" + code if s["source"] == "connect" else "promo_code:" + code.upper()


# --- the ladder ------------------------------------------------------------------------------


def attribute(
    sales: list[Row],
    clicks: dict[tuple[str, str], str],
    leads: list[Row],
    promos: dict[tuple[str, str], str],
) -> None:
    first_attributed: dict[tuple[str, bool, str], Row] = {}
    for s in sorted(sales, key=lambda s: (s["occurred_at"], s["sale_id"])):
        program = s["program_id"]
        mismatch = s["meta_program_id"] is not None and s["meta_program_id"] != program
        trusted = not mismatch and not s["metadata_missing"]
        click = s["click_id"] if trusted else None
        key = s["customer_key"] if trusted else None
        email = norm_email(s["email"]) if not mismatch else None
        customer = s["processor_customer_id"] if not mismatch else None
        promo = s["promo_code"] if not mismatch else None
        ev: dict[str, Any] = {
            "mismatch": mismatch,
            "click": click,
            "key": key,
            "email": email,
            "promo": promo,
        }
        ev["click_partner"] = clicks.get((program, click)) if click is not None else None
        ev["promo_partner"] = promos.get((program, promo_key(s, promo))) if promo is not None else None
        ev["by_email"] = lead_lookup(leads, program, "email_norm", email)
        ev["by_key"] = lead_lookup(leads, program, "customer_key", key)
        earlier = first_attributed.get((program, s["test_mode"], customer)) if customer is not None else None
        ev["earlier"] = earlier
        email_lead = ev["by_email"]["lead"]
        key_lead = ev["by_key"]["lead"]
        partner, rule = None, None
        if not mismatch:
            if ev["click_partner"] is not None:
                partner, rule = ev["click_partner"], "click"
            elif ev["promo_partner"] is not None:
                partner, rule = ev["promo_partner"], "promo_code"
            elif email_lead is not None and email_lead["partner"] is not None:
                partner, rule = email_lead["partner"], "email"
            elif earlier is not None:
                partner, rule = earlier["partner_code"], "processor_customer"
            elif key_lead is not None and key_lead["partner"] is not None:
                partner, rule = key_lead["partner"], "customer_key"
        s["partner_code"], s["attribution_rule"] = partner, rule
        click_unknown = click is not None and ev["click_partner"] is None
        reason = None
        if partner is None:
            provisional_only = any(
                lookup["provisional"] and not lookup["settled"] for lookup in (ev["by_key"], ev["by_email"])
            )
            if mismatch:
                reason = "program_mismatch"
            elif s["metadata_missing"]:
                reason = "subscription_metadata_missing"
            elif click_unknown:
                reason = "click_not_found"
            elif provisional_only:
                reason = "lead_provisional"
            elif email is not None or customer is not None or key is not None or promo is not None:
                reason = "customer_not_found"
            else:
                reason = "no_attribution_data"
        s["unattributed_reason"] = reason
        warnings = []
        if partner is not None and click_unknown:
            warnings.append("click_not_found")
        if partner is not None and s["metadata_missing"]:
            warnings.append("subscription_metadata_missing")
        if s.get("fixed"):
            warnings.append("metadata_fixed")
        s["warnings"] = warnings
        s["evidence"] = ev
        if partner is not None and customer is not None:
            first_attributed.setdefault((program, s["test_mode"], customer), s)


# --- commissions -----------------------------------------------------------------------------


def customers(sales: list[Row]) -> dict[int, int]:
    """id(sale) -> a customer number: real sales of one program sharing a customer key, processor
    customer, subscription or normalised email, directly or through others (union-find)."""
    parent = {id(s): id(s) for s in sales}

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    owner: dict[tuple[str, str, str], int] = {}
    for s in sales:
        if s["test_mode"]:
            continue
        for kind, value in (
            ("key", s["customer_key"]),
            ("pc", s["processor_customer_id"]),
            ("sub", s["subscription_id"]),
            ("email", norm_email(s["email"])),
        ):
            if value is not None:
                other = owner.setdefault((s["program_id"], kind, value), id(s))
                parent[root(id(s))] = root(other)
    return {id(s): root(id(s)) for s in sales}


def with_terms_history(rows: list[Row], settings: dict[str, Row]) -> dict[str, Row]:
    """The programs' settings, each with `versions`: [(since, terms)] from its `program_terms`
    rows (seq order; a change takes effect at the latest log time of itself and the changes
    before it): the first change's `from` terms since the start, then each change's `to`."""
    out = {}
    for program, conf in settings.items():
        changes = sorted(
            (
                r
                for r in rows
                if r["kind"] == "program_terms" and r["outcome"] == "accepted" and r["program_id"] == program
            ),
            key=lambda r: r["seq"],
        )
        versions: list[tuple[datetime | None, Row]] = []
        effective: datetime | None = None
        for change in changes:
            body = json.loads(change["body"])
            if not versions:
                versions.append((None, {k: body["from"].get(k) for k in TERMS}))
            effective = change["received_at"] if effective is None else max(effective, change["received_at"])
            versions.append((effective, {k: body["to"].get(k) for k in TERMS}))
        out[program] = {**conf, "versions": versions}
    return out


def terms_at(conf: Row, occurred_at: datetime) -> Row:
    """The program's terms in force at `occurred_at`: the last version made before it;
    without versions, its settings."""
    found: Row = conf
    for since, terms in conf.get("versions", []):
        if since is None or since < occurred_at:
            found = terms
    return found


def flat_amount(setting: Any, currency: str | None) -> int | None:
    """The flat commission of a sale in `currency`: an integer setting pays it in every currency,
    an object by currency the amount it names for the sale's currency, else nothing (None). A
    program frame gives the setting as JSON text; one that is not a valid setting counts as 0."""
    if isinstance(setting, str):
        setting = json.loads(setting)
    if isinstance(setting, dict):
        named = {code.lower(): amount for code, amount in setting.items()}
        return named.get(currency.lower()) if currency is not None else None
    return setting if isinstance(setting, int) else 0


def value_commissions(
    sales: list[Row], settings: dict[str, dict[str, Any]], partner_emails: dict[tuple[str, str], str | None]
) -> None:
    customer = customers(sales)
    anchors: dict[int, Row] = {}
    for s in sorted(sales, key=lambda s: (s["occurred_at"], s["sale_id"])):
        if not s["test_mode"] and s["partner_code"] is not None:
            anchors.setdefault(customer[id(s)], s)
    for s in sales:
        terms = terms_at(settings.get(s["program_id"], {}), s["occurred_at"])
        conf = {**DEFAULTS, **{k: v for k, v in terms.items() if v is not None}}
        months = terms.get("recurring_months")
        s["holding_days"] = conf["holding_days"]
        s["commissionable"] = False
        s["gross_commission"] = 0
        s["gross_fee"] = 0
        s["self_referral"] = False
        s["no_flat_amount"] = False
        if s["test_mode"] or s["partner_code"] is None:
            continue
        anchor = anchors[customer[id(s)]]
        if months is None:
            inside = True
        elif months <= 0:
            inside = s is anchor
        else:
            inside = s["occurred_at"] < add_months(anchor["occurred_at"], months)
        if not inside:
            continue
        s["commissionable"] = True
        if conf["commission_type"] == "flat":
            amount = flat_amount(conf["commission_flat"], s["currency"])
            s["gross_commission"] = 0 if amount is None else amount
            s["no_flat_amount"] = amount is None
        else:
            s["gross_commission"] = round_half_even(s["amount"] * conf["commission_bps"], 10_000)
        s["gross_fee"] = round_half_even(s["amount"] * conf["platform_fee_bps"], 10_000)
        partner_email = norm_email(partner_emails.get((s["program_id"], s["partner_code"])))
        email = norm_email(s["email"])
        s["self_referral"] = email is not None and email == partner_email


# --- refunds ---------------------------------------------------------------------------------


def refund_rows(rows: list[Row], events: list[Row], ids: dict[tuple[str, str], tuple[str, str]]) -> list[Row]:
    out = []
    for r in accepted(rows, "refund"):
        if r["source"] != "track" or r["amount"] is None or r["amount"] <= 0:
            continue
        hit = ids.get((r["program_id"], r["transaction_id"]))
        out.append(
            {
                "program_id": r["program_id"],
                "refund_id": coalesce(r["refund_id"], r["event_id"]),
                "source": "self_hosted",
                "event_id": r["event_id"],
                "transaction_id": r["transaction_id"],
                "charge_id": None,
                "sale_id": hit[0] if hit else None,
                "amount": r["amount"],
                "occurred_at": r["occurred_at"],
                "known_at": r["received_at"],
                "raw_currency": r["currency"],
            }
        )
    # invoice_payment.paid: (program, payment intent or charge) -> the smallest invoice it paid
    linked: dict[tuple[str, str], str] = {}
    for r in events:
        if r["event_type"] == "invoice_payment.paid" and r["invoice_id"] is not None:
            for payment in (r["payment_intent_id"], r["charge_id"]):
                key = (r["program_id"], payment)
                if payment is not None and (key not in linked or r["invoice_id"] < linked[key]):
                    linked[key] = r["invoice_id"]
    charges: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in events:
        if r["event_type"] == "charge.refunded" and coalesce(r["object_id"], r["charge_id"]) is not None:
            charges[(r["program_id"], coalesce(r["object_id"], r["charge_id"]))].append(r)
    for (program, charge), evs in charges.items():
        evs.sort(key=by_time)
        invoice_id = first(e["invoice_id"] for e in evs)
        intent = first(e["payment_intent_id"] for e in evs)
        hit = None
        # a basil charge names no invoice: the invoice its intent (else itself) is linked to
        link = coalesce(linked.get((program, intent)) if intent else None, linked.get((program, charge)))
        for candidate in (invoice_id, intent, charge, link):
            if candidate is not None and (program, candidate) in ids:
                hit = ids[(program, candidate)]
                break
        levels = sorted({e["amount"] for e in evs if e["amount"] is not None and e["amount"] > 0})
        previous = 0
        for level in levels:
            at_level = [e for e in evs if e["amount"] == level]
            out.append(
                {
                    "program_id": program,
                    "refund_id": coalesce(first(e["refund_id"] for e in at_level), at_level[0]["event_id"]),
                    "source": "connect",
                    "event_id": at_level[0]["event_id"],
                    "transaction_id": charge,
                    "charge_id": charge,
                    "sale_id": hit[0] if hit else None,
                    "amount": level - previous,
                    "occurred_at": at_level[0]["occurred_at"],
                    "known_at": min(
                        r["received_at"]
                        for r in accepted(rows, "stripe")
                        if r["event_type"] == "charge.refunded"
                        and r["program_id"] == program
                        and coalesce(r["object_id"], r["charge_id"]) == charge
                        and r["amount"] == level
                    ),
                    "raw_currency": first(e["currency"] for e in evs),
                }
            )
            previous = level
    return out


def apply_refunds(refunds: list[Row], sales: list[Row]) -> None:
    by_sale = {(s["program_id"], s["sale_id"]): s for s in sales}
    processor_refunded = {
        (r["program_id"], r["sale_id"])
        for r in refunds
        if r["source"] == "connect" and r["sale_id"] is not None
    }
    for s in sales:
        s["refunded"] = 0
        s["reversed"] = 0
        s["fee_reversed"] = 0
    for r in refunds:
        sale = by_sale.get((r["program_id"], r["sale_id"]))
        r["sale_transaction_id"] = sale["transaction_id"] if sale else None
        r["currency"] = coalesce(sale["currency"] if sale else None, r["raw_currency"])
        r["period"] = period(r["occurred_at"])
        r["applied_amount"] = 0
        r["commission_reversed"] = 0
        r["platform_fee_reversed"] = 0
        if sale is None:
            r["outcome"] = "sale_not_found"
        elif r["source"] == "self_hosted" and (r["program_id"], r["sale_id"]) in processor_refunded:
            r["outcome"] = "superseded_by_processor"
        else:
            r["outcome"] = "applied"
    for r in sorted(
        (r for r in refunds if r["outcome"] == "applied"), key=lambda r: (r["occurred_at"], r["event_id"])
    ):
        sale = by_sale[(r["program_id"], r["sale_id"])]
        gross = sale["gross_amount"]
        before = sale["refunded"]
        sale["raw_refunded"] = sale.get("raw_refunded", 0) + r["amount"]
        after = min(sale["raw_refunded"], gross)
        r["applied_amount"] = after - before
        sale["refunded"] = after
        reversed_c = reverse(sale["gross_commission"], after, gross)
        reversed_f = reverse(sale["gross_fee"], after, gross)
        r["commission_reversed"] = reversed_c - sale["reversed"]
        r["platform_fee_reversed"] = reversed_f - sale["fee_reversed"]
        sale["reversed"], sale["fee_reversed"] = reversed_c, reversed_f


def reverse(total: int, refunded: int, gross: int) -> int:
    if gross <= 0 or refunded >= gross:
        return total
    return round_half_even(total * refunded, gross)


# The latest time tally takes in (ingest/bounds.py LATEST), restated: no available_at is later.
LATEST = datetime(9999, 12, 30, 23, 59, 59, tzinfo=UTC)


def available_at(occurred_at: datetime, holding_days: int) -> datetime:
    """occurred_at + the holding days, capped at LATEST (and past year 9999 a datetime overflows)."""
    try:
        return min(occurred_at + timedelta(days=holding_days), LATEST)
    except OverflowError:
        return LATEST


def finish(sales: list[Row], now: datetime) -> None:
    for s in sales:
        s["period"] = period(s["occurred_at"])
        s["available_at"] = available_at(s["occurred_at"], s["holding_days"])
        s["commission"] = s["gross_commission"] - s["reversed"]
        s["platform_fee"] = s["gross_fee"] - s["fee_reversed"]
        if not s["commissionable"]:
            s["commission_status"] = None
        elif s["refunded"] >= s["gross_amount"]:
            s["commission_status"] = "reversed"
        elif s["self_referral"]:
            s["commission_status"] = "held"
        elif now >= s["available_at"]:
            s["commission_status"] = "approved"
        else:
            s["commission_status"] = "pending"
        if s["self_referral"]:
            s["warnings"] = [*s["warnings"], "self_referral"]
        if s["no_flat_amount"]:
            s["warnings"] = [*s["warnings"], "no_flat_amount_for_currency"]


# --- the ledger: backfill states, frozen lines, clawbacks and adjustments -------------------

STATE_FIELDS = ("partner_code", "commissionable", "gross_commission", "gross_fee", "self_referral")


def valued_sales(
    rows: list[Row], settings: dict[str, dict[str, Any]], partner_emails: dict[tuple[str, str], str | None]
) -> tuple[list[Row], list[Row], list[Row], list[Row]]:
    """Sales with fixes, attribution and commissions applied; also (connect, self-hosted, doubles)."""
    connect = connect_sales(stripe_events(rows))
    self_hosted, doubles = split_doubles(connect, self_hosted_sales(rows))
    keep_booked_ids(rows, connect, doubles)
    sales = connect + self_hosted
    apply_fixes(rows, sales)
    clicks = click_partners(rows)
    attribute(sales, clicks, lead_records(rows, clicks), promo_partners(rows))
    value_commissions(sales, settings, partner_emails)
    return sales, connect, self_hosted, doubles


def backfill_states(
    rows: list[Row],
    sales: list[Row],
    settings: dict[str, dict[str, Any]],
    partner_emails: dict[tuple[str, str], str | None],
) -> dict[tuple[str, str], list[tuple[datetime | None, str | None, tuple[Any, ...]]]]:
    """(program, sale) -> [(effective time, backfill id, values)], for sales whose values a
    backfill changed: the values with the program's first i applied backfills, i = 0..n, taking
    effect at the latest log time of those i backfills; consecutive equal values collapsed."""
    out: dict[tuple[str, str], list[tuple[datetime | None, str | None, tuple[Any, ...]]]] = {}
    backfills = [b for b in accepted_engineer(rows, "backfill") if not dry_run(b)]
    for program in sorted({b["program_id"] for b in backfills}):
        mine = sorted((b for b in backfills if b["program_id"] == program), key=lambda b: b["seq"])
        layers: list[dict[str, tuple[Any, ...]]] = []
        for i in range(len(mine)):
            later = {id(b) for b in mine[i:]}
            layer_sales, _, _, _ = valued_sales(
                [r for r in rows if id(r) not in later], settings, partner_emails
            )
            layers.append(
                {
                    s["sale_id"]: tuple(s[f] for f in STATE_FIELDS)
                    for s in layer_sales
                    if s["program_id"] == program
                }
            )
        layers.append(
            {s["sale_id"]: tuple(s[f] for f in STATE_FIELDS) for s in sales if s["program_id"] == program}
        )
        for sale_id in layers[-1]:
            states: list[tuple[datetime | None, str | None, tuple[Any, ...]]] = [
                (None, None, layers[0][sale_id])
            ]
            for i in range(1, len(layers)):
                if layers[i][sale_id] != states[-1][2]:
                    at = max(b["received_at"] for b in mine[:i])
                    states.append((at, mine[i - 1]["event_id"], layers[i][sale_id]))
            if len(states) > 1:
                out[(program, sale_id)] = states
    return out


def dry_run(b: Row) -> bool:
    try:
        return json.loads(b["body"] or "{}").get("dry_run") is True
    except (ValueError, AttributeError):
        return False


def state_lines(s: Row, values: tuple[Any, ...], refunded: int) -> dict[str, Row]:
    """partner -> the money a sale in this state holds for its partner, `refunded` refunded."""
    partner, commissionable, commission, fee, self_referral = values
    if not commissionable:
        return {}
    gross = s["gross_amount"]
    reversed_c, reversed_f = reverse(commission, refunded, gross), reverse(fee, refunded, gross)
    return {
        partner: {
            "amount": commission - reversed_c,
            "reversed": reversed_c,
            "platform_fee": fee - reversed_f,
            "platform_fee_reversed": reversed_f,
            "refunded": refunded,
            "self_referral": self_referral,
        }
    }


def approved_money(s: Row, lines: dict[str, Row], refunded: int) -> bool:
    """A state is approved money (once its time has come): commissionable, not a self-referral,
    not fully refunded."""
    return bool(lines) and not next(iter(lines.values()))["self_referral"] and refunded < s["gross_amount"]


def ledger_lines(
    sales: list[Row],
    states: dict[tuple[str, str], list[Any]],
    refunds: list[Row],
    batches: list[Row],
    now: datetime,
) -> list[Row]:
    """Walk each sale's events in time order. The line is frozen at available_at when its state
    then is approved money, else after the first later event that makes it so; from then on each
    event adds a line per partner whose money it changes. A line never frozen ends as it ends."""
    out = []
    for s in sales:
        key = (s["program_id"], s["sale_id"])
        own = states.get(key, [(None, None, tuple(s[f] for f in STATE_FIELDS))])
        if not any(values[1] for _, _, values in own):
            continue
        events = [(at, 0, k, cause, 0) for k, (at, cause, _) in enumerate(own) if k > 0]
        could_pay = [
            b["created_at"]
            for b in batches
            if b["program_id"] == s["program_id"]
            and b["cutoff"] is not None
            and b["created_at"] >= s["available_at"]
            and s["occurred_at"] < b["cutoff"]
        ]
        for r in refunds:
            if r["outcome"] == "applied" and (r["program_id"], r["sale_id"]) == key:
                # a refund logged after a batch could pay the line counts from then at the earliest
                late = bool(could_pay) and r["known_at"] >= min(could_pay)
                at = max(r["occurred_at"], r["known_at"]) if late else r["occurred_at"]
                events.append((at, 1, 0, r["event_id"], r["amount"]))
        events.sort(key=lambda e: (e[0], e[1], e[2], e[3]))
        gross = s["gross_amount"]

        def money(state: tuple[int, int]) -> dict[str, Row]:
            return state_lines(s, own[state[0]][2], state[1])  # noqa: B023 (used in this iteration)

        steps = []  # (time, rank, cause, state before, state after): a state is (index, refunded)
        state, raw_refunded = 0, 0
        for at, rank, k, cause, amount in events:
            before = (state, min(raw_refunded, gross))
            if rank == 0:
                state = k
            raw_refunded += amount
            steps.append((at, rank, cause, before, (state, min(raw_refunded, gross))))
        at_approval = ([(0, 0)] + [step[4] for step in steps if step[0] < s["available_at"]])[-1]
        frozen: tuple[datetime, tuple[int, int]] | None = None
        later = []
        if approved_money(s, money(at_approval), at_approval[1]):
            frozen = (s["available_at"], at_approval)
        for step in steps:
            if step[0] < s["available_at"]:
                continue
            if frozen is not None:
                later.append(step)
            elif approved_money(s, money(step[4]), step[4][1]):
                frozen = (step[0], step[4])
        final = (state, min(raw_refunded, gross))
        base = {
            "program_id": s["program_id"],
            "sale_id": s["sale_id"],
            "transaction_id": s["transaction_id"],
            "sale_period": s["period"],
            "currency": s["currency"],
            "occurred_at": s["occurred_at"],
        }
        if frozen is not None:
            approved_at, chosen_state = frozen
            chosen = money(chosen_state)
            status = "approved" if now >= approved_at else "pending"
        else:
            approved_at = s["available_at"]
            chosen = money(final)
            held = bool(chosen) and next(iter(chosen.values()))["self_referral"]
            if held:
                status = "held"
            elif final[1] >= gross:
                status = "reversed"
            else:
                status = "approved" if now >= approved_at else "pending"
        for partner, values in chosen.items():
            out.append(
                {
                    **base,
                    **values,
                    "partner_code": partner,
                    "kind": "commission",
                    "cause": "",
                    "adjusts": None,
                    "period": s["period"],
                    "status": status,
                    "available_at": approved_at,
                    "dated_at": s["occurred_at"],
                }
            )
        for at, rank, cause, before, after in later:
            old, new = money(before), money(after)
            for partner in sorted(set(old) | set(new)):
                delta = {
                    m: new.get(partner, {}).get(m, 0) - old.get(partner, {}).get(m, 0)
                    for m in ("amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded")
                }
                if not any(delta.values()):
                    continue
                held = (new.get(partner) or old[partner])["self_referral"]
                out.append(
                    {
                        **base,
                        **delta,
                        "partner_code": partner,
                        "kind": "clawback" if rank == 1 else "adjustment",
                        "cause": cause,
                        "adjusts": s["transaction_id"],
                        "period": period(at),
                        "status": "held" if held else ("approved" if now >= at else "pending"),
                        "self_referral": held,
                        "available_at": at,
                        "dated_at": at,
                    }
                )
    return out


# --- explain ---------------------------------------------------------------------------------

RULE_INDEX = {"click": 1, "promo_code": 2, "email": 3, "processor_customer": 4, "customer_key": 5}


def lead_not_found(lookup: dict[str, Any], what: str) -> str:
    if lookup["lead"] is not None:
        return f"settled lead {lookup['lead']['lead_id']} has no partner's click"
    if lookup["provisional"]:
        return "only provisional leads"
    return f"no lead with this {what}"


def lead_matched(lookup: dict[str, Any]) -> str | None:
    lead = lookup["lead"]
    if lead is None or lead["partner"] is None:
        return None
    return f"settled lead {lead['lead_id']} with click {lead['click']} of partner {lead['partner']}"


def explain(s: Row) -> list[Row]:
    ev = s["evidence"]
    index = RULE_INDEX.get(s["attribution_rule"] or "", 9)
    missing = "subscription metadata missing" if s["metadata_missing"] else None
    earlier = ev["earlier"]
    steps = [
        (
            "click",
            ev["click"],
            "svc_click_id",
            ev["click_partner"],
            f"click {ev['click']} of partner {ev['click_partner']}",
            "no click with this id in the program",
            missing,
        ),
        (
            "promo_code",
            ev["promo"],
            "promo_code",
            ev["promo_partner"],
            f"promo code {ev['promo']} of partner {ev['promo_partner']}",
            "no partner has this promo code",
            None,
        ),
        (
            "email",
            ev["email"],
            "email",
            lead_matched(ev["by_email"]),
            lead_matched(ev["by_email"]),
            lead_not_found(ev["by_email"], "email"),
            None,
        ),
        (
            "processor_customer",
            s["processor_customer_id"],
            "processor_customer_id",
            earlier["partner_code"] if earlier else None,
            f"earlier attributed sale {earlier['sale_id']} of partner {earlier['partner_code']}"
            if earlier
            else None,
            "no earlier attributed sale of this customer",
            None,
        ),
        (
            "customer_key",
            ev["key"],
            "svc_customer_key",
            lead_matched(ev["by_key"]),
            lead_matched(ev["by_key"]),
            lead_not_found(ev["by_key"], "customer key"),
            missing,
        ),
    ]
    out = []
    for number, (rule, value, label, partner, matched, not_found, no_data) in enumerate(steps, start=1):
        if ev["mismatch"]:
            result = "skipped"
        elif index < number:
            result = "not_tried"
        elif value is None:
            result = "no_data"
        elif partner is not None:
            result = "matched"
        else:
            result = "not_found"
        found = {"matched": matched, "not_found": not_found, "no_data": no_data}.get(result)
        looked_up = f"{label}={value}" if result in ("matched", "not_found") else None
        out.append({"step": number, "rule": rule, "looked_up": looked_up, "found": found, "result": result})
    attributed = s["partner_code"] is not None
    out.append(
        {
            "step": 6,
            "rule": "result",
            "looked_up": f"program_id={s['meta_program_id']}" if ev["mismatch"] else None,
            "found": f"partner {s['partner_code']} by rule {s['attribution_rule']}"
            if attributed
            else s["unattributed_reason"],
            "result": "attributed" if attributed else "unattributed",
        }
    )
    if "no_flat_amount_for_currency" in s["warnings"]:
        currency = s["currency"]
        out.append(
            {
                "step": 7,
                "rule": "commission",
                "looked_up": None if currency is None else f"currency={currency}",
                "found": "the flat commission names no amount for "
                + ("a sale without a currency" if currency is None else currency.upper())
                + ": the sale earns no commission",
                "result": "no_flat_amount_for_currency",
            }
        )
    return [
        {"program_id": s["program_id"], "sale_id": s["sale_id"], "transaction_id": s["transaction_id"], **o}
        for o in out
    ]


# --- one pass and periods --------------------------------------------------------------------


def ledger(
    rows: list[Row],
    settings: dict[str, dict[str, Any]],
    partner_emails: dict[tuple[str, str], str | None],
    now: datetime,
) -> dict[str, list[Row]]:
    sales, connect, self_hosted, doubles = valued_sales(rows, settings, partner_emails)
    states = backfill_states(rows, sales, settings, partner_emails)
    clicks = click_partners(rows)
    lead_list = lead_records(rows, clicks)
    ids = build_id_map(connect, self_hosted)
    refunds = refund_rows(rows, stripe_events(rows), ids)
    apply_refunds(refunds, sales)
    finish(sales, now)
    doubles += refused_duplicates(rows, ids)
    doubles = finish_doubles(
        doubles, sales, uncounted_partners(rows, doubles, clicks, lead_list, promo_partners(rows))
    )
    return {
        "sales": sales,
        "lines": ledger_lines(sales, states, refunds, payout_batches(rows), now),
        "refunds": refunds,
        "double_counts": doubles,
        "explain": [step for s in sales for step in explain(s)],
    }


def closes(rows: list[Row]) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for r in accepted_engineer(rows, "period_close"):
        try:
            value = json.loads(r["body"] or "{}").get("period")
        except (ValueError, AttributeError):
            continue
        valid = isinstance(value, str) and len(value) == 7 and value[4] == "-" and value[:4].isdigit()
        if valid and value[5:].isdigit() and 1 <= int(value[5:]) <= 12:
            key = (r["program_id"], value)
            found[key] = min(found.get(key, r["seq"]), r["seq"])
    return found


def booked_refunds(rows: list[Row], refunds: list[Row]) -> list[Row]:
    """Each refund's booked_period: its own month, unless that month was closed before the
    refund was logged; then the month it was logged in, at the earliest the one after."""
    closed = closes(rows)
    first: dict[tuple[str, str], Row] = {}
    for r in sorted(rows, key=lambda r: r["seq"]):
        if r["outcome"] == "accepted" and r["event_id"] is not None:
            first.setdefault((r["program_id"], r["event_id"]), r)
    out = []
    for refund in refunds:
        booked = refund["period"]
        close_seq = closed.get((refund["program_id"], refund["period"]))
        logged = first.get((refund["program_id"], refund["event_id"]))
        if close_seq is not None and logged is not None and logged["seq"] > close_seq:
            booked = max(period(logged["received_at"]), next_month(refund["period"]))
        out.append({**refund, "booked_period": booked})
    return out


def booked_sales(rows: list[Row], sales: list[Row]) -> list[Row]:
    """Each sale's booked_period: its own month, unless that month was closed before the sale's
    first record was logged; then the month that record was received in, at the earliest the
    one after."""
    closed = closes(rows)
    ids = ("transaction_id", "invoice_id", "payment_intent_id", "checkout_session_id")
    records = [
        r
        for r in rows
        if r["outcome"] == "accepted" and r["program_id"] is not None and r["kind"] in ("sale", "stripe")
    ]
    out = []
    for sale in sales:
        booked = sale["period"]
        close_seq = closed.get((sale["program_id"], sale["period"]))
        if close_seq is not None:
            mine = {sale.get(f) for f in ids} - {None}
            seen = [
                r for r in records if r["program_id"] == sale["program_id"] and {r.get(f) for f in ids} & mine
            ]
            first_record = min(seen, key=lambda r: r["seq"]) if seen else None
            if first_record is not None and first_record["seq"] > close_seq:
                booked = max(period(first_record["received_at"]), next_month(sale["period"]))
        out.append({**sale, "booked_period": booked})
    return out


def next_month(p: str) -> str:
    year, month = int(p[:4]), int(p[5:])
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}"


def apply_periods(
    rows: list[Row], lines: list[Row], compute: Callable[[list[Row]], list[Row]], sales: list[Row]
) -> list[Row]:
    """Closed months frozen; each later change of a closed month's line, between two closes (or
    after the last), is a line of its own: dated when the row that caused it was logged (the
    bearing row logged last in that stretch of the log, as bookings find causes), in the first
    month still open then that is not before that, nor before the month after the line's."""
    by_sale = {(s["program_id"], s["sale_id"]): s for s in sales}
    closed = closes(rows)
    programs = sorted({program for program, _ in closed})
    out = [line for line in lines if line["program_id"] not in programs]
    for program in programs:
        close_at = {p: seq for (prog, p), seq in closed.items() if prog == program}
        seqs = sorted(set(close_at.values()))
        mine = [r for r in rows if r["program_id"] == program]
        snapshots = [compute([r for r in mine if r["seq"] < t]) for t in seqs]
        snapshots.append([line for line in lines if line["program_id"] == program])
        indexed = [
            {(line["sale_id"], line["partner_code"], line["kind"], line["cause"]): line for line in snap}
            for snap in snapshots
        ]
        last = len(snapshots) - 1
        keys = {key for snap in indexed for key in snap}
        for key in keys:
            latest = next(indexed[j][key] for j in range(last, -1, -1) if key in indexed[j])
            line_period = latest["period"]
            if line_period not in close_at:
                if key in indexed[last]:
                    out.append(indexed[last][key])
                continue
            a = seqs.index(close_at[line_period])
            if key in indexed[a]:
                out.append(indexed[a][key])  # a closed month keeps its values
            moved: dict[tuple[str, str, datetime | None], dict[str, int]] = {}
            # a sale no longer counted (another record won) is still named by actions on it
            sale = by_sale.get((program, key[0]), {"program_id": program, "sale_id": key[0]})
            for j in range(a, last):
                diff = {
                    v: (indexed[j + 1][key][v] if key in indexed[j + 1] else 0)
                    - (indexed[j][key][v] if key in indexed[j] else 0)
                    for v in VALUES
                }
                if not any(diff.values()):
                    continue
                until = seqs[j + 1] if j + 1 < len(seqs) else None  # the stretch between two closes
                found = cause_of(rows, sale, seqs[j], until)
                cause, cause_at = (key[3], None) if found is None else found[:2]
                shut = {p for p, s in close_at.items() if s <= seqs[j]}
                month = next_month(line_period)
                if cause_at is not None:
                    month = max(month, period(cause_at))
                while month in shut:
                    month = next_month(month)
                bucket = moved.setdefault((month, cause, cause_at), dict.fromkeys(VALUES, 0))
                for v in VALUES:
                    bucket[v] += diff[v]
            status = indexed[last][key]["status"] if key in indexed[last] else "reversed"
            for (month, cause, cause_at), values in moved.items():
                if any(values.values()):
                    start = datetime(int(month[:4]), int(month[5:]), 1, tzinfo=UTC)
                    out.append(
                        {
                            **latest,
                            **values,
                            "kind": "clawback" if latest["kind"] == "clawback" else "adjustment",
                            "cause": cause,
                            "adjusts": latest["transaction_id"],
                            "period": month,
                            "status": status,
                            "dated_at": max(
                                t for t in (latest["dated_at"], start, cause_at) if t is not None
                            ),
                        }
                    )
    return out


# --- payouts ---------------------------------------------------------------------------------


def recorded_minimum(body: Any) -> int:
    """The payout minimum a batch recorded (0 when none, or not a whole number, or below 0)."""
    value = body.get("payout_minimum") if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        return 0
    return value


def snapshot_of(body: Any) -> Row | None:
    """The batch's snapshot, its rows kept when they name partner and currency and a whole
    rounding >= 0; None when it has none."""
    found = body.get("snapshot") if isinstance(body, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("rows"), list):
        return None

    def valid(row: Any) -> bool:
        if not isinstance(row, dict):
            return False
        rounding = row.get("rounding", 0)
        return (
            isinstance(row.get("partner_code"), str)
            and isinstance(row.get("currency"), str)
            and type(rounding) is int
            and 0 <= rounding < 2**62
        )

    return {**found, "rows": [row for row in found["rows"] if valid(row)]}


def payout_batches(rows: list[Row]) -> list[Row]:
    """Accepted batch actions in seq order (the first row of each id counts), with their payment
    or cancel (whichever came first after the batch) and their rows' failures (after the payment,
    of a row the snapshot pays; the first of each row)."""
    found: dict[tuple[str, str], Row] = {}
    for r in sorted(accepted(rows, "payout_batch"), key=lambda r: r["seq"]):
        try:
            body = json.loads(r["body"] or "{}")
        except ValueError:
            body = {}
        up_to = body.get("up_to") if isinstance(body, dict) else None
        try:
            day = (
                datetime.strptime(up_to[:10], "%Y-%m-%d").replace(tzinfo=UTC)
                if isinstance(up_to, str)
                else None
            )
        except ValueError:
            day = None
        snapshot = snapshot_of(body)
        found.setdefault(
            (r["program_id"], r["event_id"]),
            {
                "program_id": r["program_id"],
                "payout_id": r["event_id"],
                "seq": r["seq"],
                "up_to": up_to[:10] if day is not None else None,
                "cutoff": day + timedelta(days=1) if day is not None else None,
                "created_at": r["received_at"],
                "created_by": body.get("by") if isinstance(body, dict) else None,
                "status": "open",
                "paid_at": None,
                "paid_by": None,
                "paid_seq": None,
                "cancel_seq": None,
                "cancelled_at": None,
                "cancelled_by": None,
                "cancel_reason": None,
                "payout_minimum": recorded_minimum(body),
                "snapshot": None if snapshot is None else json.dumps(snapshot, sort_keys=True),
                "pairs": None
                if snapshot is None
                else {
                    (row["partner_code"], row["currency"]): row.get("rounding", 0) for row in snapshot["rows"]
                },
                "failed": {},
                "failures": None,
            },
        )
    batches = sorted(found.values(), key=lambda b: b["seq"])
    for b in batches:
        b["number"] = sum(
            1 for other in batches if other["program_id"] == b["program_id"] and other["seq"] <= b["seq"]
        )
    marks = sorted([*accepted(rows, "payout_paid"), *accepted(rows, "payout_cancel")], key=lambda r: r["seq"])
    for r in marks:
        body = json.loads(r["body"] or "{}")
        for b in batches:
            match = (b["program_id"], b["payout_id"]) == (r["program_id"], body.get("payout_id"))
            if not match or r["seq"] <= b["seq"] or b["status"] != "open":
                continue
            if r["kind"] == "payout_paid":
                b.update(status="paid", paid_at=r["received_at"], paid_by=body.get("by"), paid_seq=r["seq"])
            else:
                b.update(
                    status="cancelled",
                    cancelled_at=r["received_at"],
                    cancelled_by=body.get("by"),
                    cancel_reason=body.get("reason"),
                    cancel_seq=r["seq"],
                )
    for r in sorted(accepted(rows, "payout_row_failed"), key=lambda r: r["seq"]):
        body = json.loads(r["body"] or "{}")
        for b in batches:
            if (b["program_id"], b["payout_id"]) != (r["program_id"], body.get("payout_id")):
                continue
            pair = (body.get("partner_code"), body.get("currency"))
            if (
                b["paid_seq"] is None
                or r["seq"] <= b["paid_seq"]
                or b["pairs"] is None
                or pair not in b["pairs"]
            ):
                continue
            b["failed"].setdefault(
                pair,
                {"seq": r["seq"], "at": r["received_at"], "by": body.get("by"), "reason": body.get("reason")},
            )
    for b in batches:
        if b["failed"]:
            b["failures"] = json.dumps(
                [
                    {
                        "partner_code": code,
                        "currency": currency,
                        "reason": f["reason"],
                        "failed_at": f["at"].isoformat().replace("+00:00", "Z"),
                        "failed_by": f["by"],
                        "seq": f["seq"],
                    }
                    for (code, currency), f in sorted(b["failed"].items())
                ],
                sort_keys=True,
            )
    return batches


def rounding_lines(batches: list[Row]) -> list[Row]:
    """Per snapshot row paying less than its lines (`rounding` > 0): minus the rounding, held
    by the batch first, and plus it, free; booked by the batch itself."""
    out = []
    for b in batches:
        for (code, currency), rounding in sorted((b["pairs"] or {}).items()):
            if rounding == 0:
                continue
            for sign, cause, first_batch in (
                (-1, b["payout_id"], b["payout_id"]),
                (1, f"{b['payout_id']}:carried", None),
            ):
                out.append(
                    {
                        "program_id": b["program_id"],
                        "sale_id": f"{b['payout_id']}:{code}:{currency}",
                        "transaction_id": None,
                        "partner_code": code,
                        "kind": "adjustment",
                        "cause": cause,
                        "adjusts": None,
                        "period": period(b["created_at"]),
                        "sale_period": period(b["created_at"]),
                        "currency": currency,
                        "amount": sign * rounding,
                        "reversed": 0,
                        "platform_fee": 0,
                        "platform_fee_reversed": 0,
                        "refunded": 0,
                        "status": "approved",
                        "self_referral": False,
                        "occurred_at": b["created_at"],
                        "available_at": b["created_at"],
                        "dated_at": b["created_at"],
                        "booked_seq": b["seq"],
                        "booked_at": b["created_at"],
                        "status_reason": "rounded to what the payout service can send",
                        "status_by": None,
                        "first_batch": first_batch,
                    }
                )
    return out


def manual_lines(rows: list[Row], now: datetime) -> list[Row]:
    """Each accepted manual entry (partner, currency, a non-zero amount): an approved `manual`
    line booked by its own row, in the first month open when it was logged."""
    closed = closes(rows)
    acts = finance_actions(rows)
    out = []
    seen: set[tuple[str, str]] = set()
    for r in sorted(accepted(rows, "manual_entry"), key=lambda r: r["seq"]):
        if r["partner_code"] is None or r["currency"] is None or not r["amount"]:
            continue
        if (r["program_id"], r["event_id"]) in seen:
            continue
        seen.add((r["program_id"], r["event_id"]))
        body = json.loads(r["body"] or "{}")
        month = period(r["received_at"])
        while (r["program_id"], month) in closed and closed[(r["program_id"], month)] < r["seq"]:
            month = next_month(month)
        line = {
            "program_id": r["program_id"],
            "sale_id": r["event_id"],
            "transaction_id": r["event_id"],
            "partner_code": r["partner_code"],
            "kind": "manual",
            "cause": r["event_id"],
            "adjusts": None,
            "period": month,
            "sale_period": period(r["received_at"]),
            "currency": r["currency"],
            "amount": r["amount"],
            "reversed": 0,
            "platform_fee": 0,
            "platform_fee_reversed": 0,
            "refunded": 0,
            "status": "approved",
            "self_referral": False,
            "occurred_at": r["received_at"],
            "available_at": r["received_at"],
            "dated_at": r["received_at"],
            "booked_seq": r["seq"],
            "booked_at": r["received_at"],
            "status_reason": body.get("reason"),
            "status_by": body.get("by"),
            "payout_id": None,
        }
        line["frozen"] = frozen_at(line, closed)
        state, reason, by = action_state(acts, line["program_id"], line["sale_id"], line["frozen"])
        if state is not None:
            line["status_reason"], line["status_by"] = (
                coalesce(reason, line["status_reason"]),
                coalesce(by, line["status_by"]),
            )
        if state in ("held", "void"):
            line["status"] = state
        out.append(line)
    return [*out, *compensations(out, acts, closed, now)]


def _before(seq: int, line: Row) -> int:
    frozen = line.get("frozen")
    return seq if frozen is None else min(seq, frozen)


def apply_payouts(lines: list[Row], batches: list[Row], acts: list[Row]) -> None:
    """Each booked line of non-zero amount is held by the first batch of its program (by seq),
    made after its booking while its sale was neither held nor void, with a cut-off after its
    date, that pays its partner in its currency (a batch without snapshot: any); when that
    batch lets it go (a cancel, its row's failure), by the first such batch after that; and so
    on. A rounding line is its own batch's first. `custody`: every (payout id, seq, release)."""
    for line in lines:
        line["payout_id"] = None
        line["custody"] = []
        if line["booked_seq"] is None or line["amount"] == 0:
            continue
        free_from = -1
        for b in batches:
            if b["program_id"] != line["program_id"] or b["seq"] <= free_from:
                continue
            own = line.get("first_batch") == b["payout_id"]
            takes = own or (
                line["booked_seq"] < b["seq"]
                and b["cutoff"] is not None
                and line["dated_at"] < b["cutoff"]
                and (b["pairs"] is None or (line["partner_code"], line["currency"]) in b["pairs"])
                and action_state(acts, line["program_id"], line["sale_id"], _before(b["seq"], line))[0]
                not in ("held", "void")
            )
            if not takes:
                continue
            failure = b["failed"].get((line["partner_code"], line["currency"]))
            release = coalesce(b["cancel_seq"], failure["seq"] if failure else None)
            line["custody"].append((b["payout_id"], b["seq"], release))
            if release is None:
                line["payout_id"] = b["payout_id"]
                line["status"] = "paid" if b["status"] == "paid" else "approved"
                break
            free_from = release
        line.pop("first_batch", None)


def line_history(lines: list[Row], rows: list[Row]) -> None:
    """Each booked line's entries after its booking: its owed amount changes with holds,
    releases and voids of its sale (acts while a batch holds it change nothing), and when a
    batch lets it go while its sale is held or void."""
    acts = finance_actions(rows)
    at = {r["seq"]: (r["received_at"], r["event_id"]) for r in rows}
    words = {"hold": "held", "release": "released", "void": "void"}
    for line in lines:
        custody = line.pop("custody")
        frozen = line.pop("frozen", None)
        line["history"] = None
        if line["booked_seq"] is None or line["amount"] == 0:
            continue
        owed, state, entries = line["amount"], "owed", []
        mine = [
            a
            for a in acts
            if (a["program_id"], a["sale_id"]) == (line["program_id"], line["sale_id"])
            and a["seq"] > line["booked_seq"]
            and (frozen is None or a["seq"] < frozen)
        ]
        seqs = sorted(
            {a["seq"] for a in mine} | {c[1] for c in custody} | {c[2] for c in custody if c[2] is not None}
        )
        for seq in seqs:
            reason = cause = when = None
            for a in (a for a in mine if a["seq"] == seq):
                if a["action"] == "void":
                    state = "void"
                elif state != "void":
                    state = "held" if a["action"] == "hold" else "owed"
                word = words[a["action"]]
                reason = f"{word}: {a['reason']}" if a.get("reason") else word
                cause, when = a["id"], a["at"]
            for payout_id, _, release in custody:
                if release == seq:
                    when, cause = at[seq]
                    reason = f"let go by payout {payout_id} while the sale is {state}"
            in_batch = any(
                start <= seq and (release is None or seq < release) for _, start, release in custody
            )
            now = line["amount"] if in_batch or state == "owed" else 0
            if now != owed:
                entries.append(
                    {
                        "seq": seq,
                        "at": when.isoformat().replace("+00:00", "Z"),
                        "amount": now - owed,
                        "reason": reason,
                        "cause": cause,
                    }
                )
                owed = now
        line["history"] = json.dumps(entries, sort_keys=True) if entries else None


# --- bookings and finance actions --------------------------------------------------------------

BOOKING_MONEY = ["amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded"]
SALE_ID_FIELDS = ["transaction_id", "invoice_id", "payment_intent_id", "checkout_session_id", "charge_id"]
ROW_ID_FIELDS = [*SALE_ID_FIELDS, "object_id", "subscription_id"]
CUSTOMER_FIELDS = ["customer_key", "processor_customer_id", "click_id"]


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def booked_lines(rows: list[Row]) -> list[Row]:
    """Every line of every accepted booking row, as booked."""
    out = []
    for r in sorted(accepted(rows, "booking"), key=lambda r: r["seq"]):
        body = json.loads(r["body"])
        for line in body["lines"]:
            out.append(
                {
                    **line,
                    **{name: _time(line[name]) for name in ("occurred_at", "available_at", "dated_at")},
                    "program_id": r["program_id"],
                    "booked_seq": r["seq"],
                    "booked_at": r["received_at"],
                    "as_of": body["as_of"],
                    "status": "approved",
                    "payout_id": None,
                }
            )
    return out


def keep_booked_ids(rows: list[Row], connect: list[Row], doubles: list[Row]) -> None:
    """A connect sale paired with a self-hosted sale that a booking holds takes the booked
    sale's id (the first booked, then the smallest id), in the sales and the doubles report."""
    first_booking: dict[tuple[str, str], int] = {}
    for line in booked_lines(rows):
        key = (line["program_id"], line["sale_id"])
        first_booking[key] = min(first_booking.get(key, line["booked_seq"]), line["booked_seq"])
    names: dict[tuple[str, str], tuple[int, str]] = {}
    for d in doubles:
        seq = first_booking.get((d["program_id"], d["duplicate_id"]))
        if d["kind"] == "connect_and_self_hosted" and seq is not None:
            key = (d["program_id"], d["sale_id"])
            names[key] = min(names.get(key, (seq, d["duplicate_id"])), (seq, d["duplicate_id"]))
    for row in [*connect, *(d for d in doubles if d["kind"] == "connect_and_self_hosted")]:
        name = names.get((row["program_id"], row["sale_id"]))
        if name is not None:
            row["sale_id"] = name[1]


def finance_actions(rows: list[Row]) -> list[Row]:
    out = []
    for r in sorted(accepted(rows, "commission_action"), key=lambda r: r["seq"]):
        body = json.loads(r["body"])
        if body.get("action") in ("hold", "release", "void") and body.get("sale_id") is not None:
            out.append(
                {
                    **body,
                    "program_id": r["program_id"],
                    "seq": r["seq"],
                    "id": r["event_id"],
                    "at": r["received_at"],
                }
            )
    return out


def action_state(
    acts: list[Row], program_id: str, sale_id: str, before: int | None = None
) -> tuple[str | None, str | None, str | None]:
    """(held | released | void | None, reason, by) of a sale after its actions (before seq
    `before`)."""
    state, reason, by = None, None, None
    for a in acts:
        if (a["program_id"], a["sale_id"]) != (program_id, sale_id) or (
            before is not None and a["seq"] >= before
        ):
            continue
        if state == "void":
            continue
        state = {"hold": "held", "release": "released", "void": "void"}[a["action"]]
        reason, by = a["reason"], a["by"]
    return state, reason, by


def cause_of(
    rows: list[Row], s: Row, as_of: int, until: int | None = None
) -> tuple[str, datetime, int] | None:
    """(event id, received_at) of the latest accepted row after `as_of` (and before `until`)
    bearing on sale `s`."""
    ids = {s.get(f) for f in SALE_ID_FIELDS} - {None}
    best = None
    for r in rows:
        if r["outcome"] != "accepted" or r["program_id"] != s["program_id"] or r["seq"] <= as_of:
            continue
        if until is not None and r["seq"] >= until:
            continue
        if r["kind"] in ("booking", "close_booking", "close_booked"):  # what the reconciler showed
            continue
        bears = (
            r["kind"] in ("metadata_fix", "backfill", "program_terms", "promo_code")
            or bool({r.get(f) for f in ROW_ID_FIELDS} & ids)
            or any(r.get(f) is not None and r.get(f) == s.get(f) for f in CUSTOMER_FIELDS)
            or (
                norm_email(r.get("email")) is not None
                and norm_email(r.get("email")) == norm_email(s.get("email"))
            )
            or (r["kind"] == "commission_action" and json.loads(r["body"]).get("sale_id") == s["sale_id"])
        )
        if bears and (
            best is None
            or (r["received_at"], r["event_id"] or "") > (best["received_at"], best["event_id"] or "")
        ):
            best = r
    return None if best is None else (best["event_id"], best["received_at"], best["seq"])


def clock_status(now: datetime, since: datetime) -> str:
    return "approved" if now >= since else "pending"


def overlay(lines: list[Row], rows: list[Row], sales: list[Row], now: datetime) -> list[Row]:
    """reconcile/bookings.py restated: booked sales keep their booked lines, and each partner's
    difference from what the log implies now is a new line dated at its cause; then actions."""
    for line in lines:
        line["booked_seq"] = None
        line["booked_at"] = None
    books = booked_lines(rows)
    if books:
        booked_sales = {(b["program_id"], b["sale_id"]) for b in books}
        free = [line for line in lines if (line["program_id"], line["sale_id"]) not in booked_sales]
        implied = [line for line in lines if (line["program_id"], line["sale_id"]) in booked_sales]
        now_sums: dict[tuple[str, str, str | None], dict[str, int]] = {}
        self_ref: dict[tuple[str, str, str | None], bool] = {}
        for line in implied:
            key = (line["program_id"], line["sale_id"], line["partner_code"])
            bucket = now_sums.setdefault(key, dict.fromkeys(BOOKING_MONEY, 0))
            for m in BOOKING_MONEY:
                bucket[m] += line[m]
            self_ref[key] = self_ref.get(key, False) or bool(line["self_referral"])
        was_sums: dict[tuple[str, str, str | None], dict[str, int]] = {}
        for b in books:
            key = (b["program_id"], b["sale_id"], b["partner_code"])
            bucket = was_sums.setdefault(key, dict.fromkeys(BOOKING_MONEY, 0))
            for m in BOOKING_MONEY:
                bucket[m] += b[m]
        sales_by_id = {(s["program_id"], s["sale_id"]): s for s in sales}
        closed = closes(rows)
        changes = []
        for key in set(now_sums) | set(was_sums):
            after = now_sums.get(key, dict.fromkeys(BOOKING_MONEY, 0))
            before = was_sums.get(key, dict.fromkeys(BOOKING_MONEY, 0))
            diff = {m: after[m] - before[m] for m in BOOKING_MONEY}
            if not any(diff.values()):
                continue
            mine = [b for b in books if (b["program_id"], b["sale_id"]) == key[:2]]
            first_booked = min(mine, key=lambda b: b["booked_seq"])
            as_of = max(b["as_of"] for b in mine)
            sale = sales_by_id.get(key[:2], {"program_id": key[0], "sale_id": key[1]})
            found = cause_of(rows, sale, as_of)
            cause, cause_at, cause_seq = found if found is not None else (f"after {as_of}", now, None)
            # never into a month closed before the cause was logged: the first one open then
            month = period(cause_at)
            while (key[0], month) in closed and (cause_seq is None or closed[(key[0], month)] < cause_seq):
                month = next_month(month)
            cause_at = max(cause_at, datetime(int(month[:4]), int(month[5:]), 1, tzinfo=UTC))
            same = key in now_sums and key in was_sums
            changes.append(
                {
                    "program_id": key[0],
                    "sale_id": key[1],
                    "transaction_id": first_booked["transaction_id"],
                    "partner_code": key[2],
                    "kind": "clawback" if same and diff["refunded"] != 0 else "adjustment",
                    "cause": cause,
                    "adjusts": first_booked["transaction_id"],
                    "period": month,
                    "sale_period": first_booked["sale_period"],
                    "currency": first_booked["currency"],
                    **diff,
                    "status": clock_status(now, cause_at),
                    "self_referral": self_ref.get(key, False),
                    "occurred_at": first_booked["occurred_at"],
                    "available_at": cause_at,
                    "dated_at": cause_at,
                    "booked_seq": None,
                    "booked_at": None,
                    "payout_id": None,
                }
            )
        lines = [*free, *books, *changes]
    acts = finance_actions(rows)
    closed = closes(rows)
    for line in lines:
        line["frozen"] = frozen_at(line, closed)
        state, reason, by = action_state(acts, line["program_id"], line["sale_id"], line["frozen"])
        line["status_reason"], line["status_by"] = reason, by
        if state == "void":
            line["status"] = "void"
        elif state == "held":
            line["status"] = "held"
        elif state == "released" and line["status"] == "held" and line["booked_seq"] is None:
            line["status"] = clock_status(now, line["available_at"])
    return [*lines, *compensations(lines, acts, closed, now)]


def frozen_at(line: Row, closed: dict[tuple[str, str], int]) -> int | None:
    """A booked line of a closed month heeds no action logged after both its booking and the
    close (CONTRACT 15: closed months never move)."""
    close_seq = closed.get((line["program_id"], line["period"]))
    if line["booked_seq"] is None or close_seq is None:
        return None
    return max(line["booked_seq"], close_seq)


def compensations(
    lines: list[Row], acts: list[Row], closed: dict[tuple[str, str], int], now: datetime
) -> list[Row]:
    """For each frozen line, each later action that changes whether it is owed books an
    adjustment of its own (minus on a hold or void of an owed line, plus on a release of a held
    one), dated when logged, in the first month open then, booked by the action itself."""
    words = {"hold": "held", "release": "released", "void": "void"}
    out = []
    for line in lines:
        frozen = line.get("frozen")
        if frozen is None or frozen < 0:
            continue
        state = line["status"] if line["status"] in ("held", "void") else "owed"
        for a in acts:
            if (a["program_id"], a["sale_id"]) != (line["program_id"], line["sale_id"]) or a["seq"] <= frozen:
                continue
            sign = 0
            if state == "owed" and a["action"] in ("hold", "void"):
                sign = -1
            elif state == "held" and a["action"] == "release":
                sign = 1
            if state != "void":
                state = {"hold": "held", "release": "owed", "void": "void"}[a["action"]]
            if not sign:
                continue
            month = period(a["at"])
            while (line["program_id"], month) in closed and closed[(line["program_id"], month)] < a["seq"]:
                month = next_month(month)
            dated = max(a["at"], datetime.fromisoformat(f"{month}-01T00:00:00+00:00"))
            word = words[a["action"]]
            out.append(
                {
                    **line,
                    **{m: sign * line[m] for m in BOOKING_MONEY},
                    "kind": "adjustment",
                    "cause": a["id"],
                    "adjusts": line["transaction_id"],
                    "period": month,
                    "status": clock_status(now, dated),
                    "self_referral": False,
                    "available_at": dated,
                    "dated_at": dated,
                    "booked_seq": a["seq"],
                    "booked_at": a["at"],
                    "status_reason": f"{word}: {a['reason']}" if a.get("reason") else word,
                    "status_by": a["by"],
                    "frozen": -1,
                }
            )
    return out


def reconcile_reference(
    rows: list[Row], programs: list[Row], partners: list[Row], now: datetime
) -> dict[str, list[Row]]:
    """The reference result: the same tables as reconcile.pipeline.Result, as lists of dicts."""
    rows = [{**r, "occurred_at": coalesce(r["occurred_at"], r["received_at"])} for r in rows]
    settings: dict[str, Row] = {}
    for p in programs:
        settings.setdefault(p["program_id"], p)
    settings = with_terms_history(rows, settings)
    partner_emails: dict[tuple[str, str], str | None] = {}
    for p in partners:
        partner_emails.setdefault((p["program_id"], p["code"]), p["email"])
    current = ledger(rows, settings, partner_emails, now)
    # closed months first, then what was booked (a booking holds the lines as they were shown)
    lines = overlay(
        apply_periods(
            rows,
            current["lines"],
            lambda prefix: ledger(prefix, settings, partner_emails, now)["lines"],
            current["sales"],
        ),
        rows,
        current["sales"],
        now,
    )
    batches = payout_batches(rows)
    lines = [*lines, *manual_lines(rows, now), *rounding_lines(batches)]
    apply_payouts(lines, batches, finance_actions(rows))
    line_history(lines, rows)
    return {
        "sales": booked_sales(rows, current["sales"]),
        "commissions": lines,
        "refunds": booked_refunds(rows, current["refunds"]),
        "double_counts": current["double_counts"],
        "explain": current["explain"],
        "unroutable": unroutable_events(rows, settings),
        "payouts": batches,
    }


# --- unroutable events -----------------------------------------------------------------------


def route_now(r: Row, settings: dict[str, Row]) -> tuple[str | None, str]:
    """(the program routing picks now, the reason it is unroutable): ingest's rule."""
    account, meta = r["stripe_account"], r["meta_program_id"]
    sharing = sorted(
        p for p, s in settings.items() if account is not None and s.get("stripe_account_id") == account
    )
    if account is not None:
        target = sharing[0] if len(sharing) == 1 else meta if meta in sharing else None
    else:
        target = meta if meta in settings else None
    if target is not None:
        return target, "awaiting_backfill"
    if account is None:
        return None, "no_account"
    return None, "account_shared" if sharing else "account_not_connected"


def unroutable_events(rows: list[Row], settings: dict[str, Row]) -> list[Row]:
    """Each unroutable event once (its first record by time), unless a backfill picked it up."""
    taken = {
        r["event_id"]
        for r in rows
        if r["kind"] == "stripe"
        and r["source"] == "backfill"
        and r["outcome"] == "accepted"
        and r["program_id"] is not None
        and r["event_id"] is not None
    }
    found: dict[str | None, Row] = {}
    stray = [
        r
        for r in rows
        if r["kind"] == "stripe"
        and r["outcome"] == "unroutable"
        and r["program_id"] is None
        and r["event_id"] not in taken
    ]
    for r in sorted(stray, key=lambda r: (r["occurred_at"], r["event_id"] or "", r["seq"])):
        kept = found.setdefault(r["event_id"], dict(r))
        kept["received_at"] = min(kept["received_at"], r["received_at"])
    for kept in found.values():
        kept["routes_to"], kept["reason"] = route_now(kept, settings)
    return list(found.values())
