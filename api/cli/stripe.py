"""`tally stripe trigger EVENT_TYPE`: a Stripe-format event, signed with the webhook secret the
server has, posted to its webhook path (CONTRACT section 5), in the spirit of the Stripe CLI's
`stripe trigger`: the way to see a processor sale land without a Stripe account."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import click
import httpx

from api.cli import stripe_events as events
from api.cli.client import server_url, unreachable
from api.cli.errors import AuthError, api_error
from api.cli.options import WHOLE, examples, json_option, url_option
from api.cli.output import emit, money
from ingest.domain.events import (
    CHECKOUT_EVENTS,
    INVOICE_EVENTS,
    KNOWN_EVENTS,
    REFUND_EVENTS,
    SUBSCRIPTION_EVENTS,
)
from ingest.stripe import (
    META_CLICK_ID,
    META_CUSTOMER_KEY,
    META_PROGRAM_ID,
    extract,
    sign,
)


@click.group(
    short_help="send signed Stripe-format test events to the webhook (stripe trigger)",
    epilog=examples("tally stripe trigger checkout.session.completed --program prog_... --aff alice"),
)
def stripe() -> None:
    """The payment processor's side, for trying tally without a Stripe account."""


def _created(text: str | None) -> int:
    """`--created` as unix seconds: a date (midnight UTC) or an RFC 3339 time; now when absent."""
    if text is None:
        return int(datetime.now(UTC).timestamp())
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not a date or RFC 3339 time: {text!r}", param_hint="--created") from None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def _metadata(pairs: tuple[str, ...]) -> dict[str, str]:
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"not KEY=VALUE: {pair!r}", param_hint="--metadata")
        metadata[key] = value
    return metadata


def record_click(url: str, program: str, partner: str) -> str:
    """A click for `partner` through the public click endpoint, as the browser script records a
    visit with `?aff=PARTNER`; its click id."""
    body = {"program_id": program, "partner_code": partner, "url": f"{url}/?aff={partner}"}
    try:
        response = httpx.post(f"{url}/api/v1/track/click", json=body, timeout=30)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise unreachable(url, exc) from None
    if response.status_code >= 400:
        raise api_error(response)
    return str(response.json()["data"]["click_id"])


def build(event_type: str, o: dict[str, Any], metadata: dict[str, str], created: int) -> dict[str, Any]:
    """The event's object for `event_type` from the command's options `o`."""
    live, amount, currency = not o["test_mode"], o["amount"], o["currency"].lower()
    customer = o["customer"] or events.new_id("cus")
    subscription = o["subscription"] or events.new_id("sub")
    if event_type in CHECKOUT_EVENTS:
        payment = o["mode"] == "payment"
        return events.checkout_session(
            mode=o["mode"],
            amount=amount,
            currency=currency,
            customer=customer,
            email=o["email"],
            metadata=metadata,
            created=created,
            payment_intent=(o["payment_intent"] or events.new_id("pi")) if payment else None,
            subscription=None if payment else subscription,
            invoice=None if payment else (o["invoice"] or events.new_id("in")),
            livemode=live,
        )
    if event_type in INVOICE_EVENTS:
        return events.invoice(
            invoice_id=o["invoice"] or events.new_id("in"),
            amount=amount,
            currency=currency,
            customer=customer,
            email=o["email"],
            subscription=subscription,
            billing_reason=o["billing_reason"],
            paid_at=created,
            metadata=metadata,
            legacy=events.legacy_layout(o["api_version"]),
            livemode=live,
        )
    if event_type in REFUND_EVENTS:
        refunded = amount if o["refunded"] is None else o["refunded"]
        if refunded > amount:
            raise click.BadParameter("more than --amount", param_hint="--refunded")
        charge = events.refunded_charge(
            amount=amount,
            refunded=refunded,
            currency=currency,
            customer=customer,
            payment_intent=o["payment_intent"] or events.new_id("pi"),
            created=created,
            metadata=metadata,
            livemode=live,
        )
        if o["invoice"]:  # the legacy layout names the invoice a charge paid
            charge["invoice"] = o["invoice"]
        return charge
    if event_type in SUBSCRIPTION_EVENTS:
        return events.subscription(
            subscription_id=subscription,
            customer=customer,
            currency=currency,
            metadata=metadata,
            created=created,
            livemode=live,
        )
    return events.invoice_payment(  # invoice_payment.paid (LINK_EVENTS)
        invoice_id=o["invoice"] or events.new_id("in"),
        payment_intent=o["payment_intent"] or events.new_id("pi"),
        amount=amount,
        currency=currency,
        paid_at=created,
        livemode=live,
    )


def _say(event_type: str, envelope: dict[str, Any], answer: dict[str, Any], url: str) -> None:
    """What was sent and what it means, for people."""
    fields = extract(envelope)
    where = f"{url}{events.WEBHOOK_PATH}"
    if answer.get("duplicate"):
        verdict = "a duplicate (the server has this event already; nothing new)"
    elif answer.get("routed") is False:
        verdict = (
            "stored, but routed to no program (give --program, or --stripe-account of a program's account)"
        )
    else:
        verdict = f"accepted for program {answer.get('program_id')}"
    print(f"sent {event_type} {envelope['id']} to {where}: {verdict}")
    if answer.get("test_mode"):
        print("test mode (livemode: false): stored, never commissioned")
    amount = money(fields["amount"], fields["currency"])
    meta = ", ".join(f"{k} {fields[k]}" for k in ("click_id", "customer_key") if fields.get(k))
    if event_type in REFUND_EVENTS:
        print(f"refund {fields['refund_id']} of transaction {fields['transaction_id']}: {amount}")
    elif event_type in CHECKOUT_EVENTS | INVOICE_EVENTS:
        print(f"transaction {fields['transaction_id']}: {amount}" + (f" ({meta})" if meta else ""))
    elif event_type in SUBSCRIPTION_EVENTS:
        print(f"subscription {fields['subscription_id']}" + (f" ({meta})" if meta else ""))
    else:
        print(f"invoice {fields['invoice_id']} paid by {fields['payment_intent_id']}")
    program = answer.get("program_id")
    if program and fields.get("transaction_id") and not answer.get("duplicate"):
        print(
            "next: `tally reconcile` (operator), or wait for the scheduled run, then "
            f"`tally explain --program {program} --transaction {fields['transaction_id']}`",
            file=sys.stderr,
        )


@stripe.command(
    "trigger",
    short_help="send a signed Stripe-format test event to the server's webhook",
    epilog=examples(
        "tally stripe trigger checkout.session.completed --program prog_... --aff alice --amount 4900",
        "tally stripe trigger invoice.paid --program prog_... --customer-key u_42 --subscription sub_1",
        "tally stripe trigger charge.refunded --program prog_... --payment-intent pi_... --refunded 1000",
        "tally stripe trigger checkout.session.completed --stripe-account acct_... --dry-run",
        after="The event is signed with the first of TALLY_STRIPE_WEBHOOK_SECRETS (or --secret) as Stripe\n"
        "signs it and posted to POST /webhooks/stripe; amounts are minor units, as Stripe sends them.",
    ),
)
@click.argument("event_type", metavar="EVENT_TYPE", type=click.Choice(sorted(KNOWN_EVENTS)))
@url_option()
@click.option(
    "--secret",
    metavar="WHSEC",
    help="the webhook signing secret (default: the first of TALLY_STRIPE_WEBHOOK_SECRETS); a secret on "
    "the command line is visible to other local users",
)
@click.option("--program", metavar="PROGRAM", help="metadata.program_id: the program the event is for")
@click.option(
    "--stripe-account",
    metavar="ACCOUNT",
    help="the Connect account (acct_...) the event comes from: routes it to the program with that "
    "stripe_account_id",
)
@click.option(
    "--aff",
    metavar="PARTNER",
    help="first record a click for this partner (as a visit with ?aff=PARTNER does) and send its click id "
    "as metadata.svc_click_id; needs --program",
)
@click.option("--click-id", metavar="CLICK", help="metadata.svc_click_id: a partner's click id (clk_...)")
@click.option(
    "--customer-key", metavar="KEY", help="metadata.svc_customer_key: the brand's customer id its leads name"
)
@click.option("--metadata", "pairs", multiple=True, metavar="KEY=VALUE", help="more metadata (repeatable)")
@click.option(
    "--amount",
    type=WHOLE,
    default=2000,
    show_default=True,
    metavar="MINOR",
    help="the amount in minor units (2000 usd is 20.00)",
)
@click.option("--currency", default="usd", show_default=True, help="the lower-case ISO currency")
@click.option(
    "--refunded",
    type=WHOLE,
    metavar="MINOR",
    help="charge.refunded: how much of --amount was refunded (default: all)",
)
@click.option("--customer", metavar="CUS", help="the processor's customer id, cus_... (default: a new one)")
@click.option("--email", help="the customer's email")
@click.option(
    "--mode",
    type=click.Choice(("payment", "subscription")),
    default="payment",
    show_default=True,
    help="checkout.session.*: a one-time payment, or a subscription's first payment",
)
@click.option(
    "--payment-intent",
    metavar="PI",
    help="the payment intent (pi_...) a payment-mode checkout made, a charge.refunded refunds or an "
    "invoice_payment.paid links (default: a new one)",
)
@click.option("--invoice", metavar="IN", help="the invoice id, in_... (default: a new one)")
@click.option("--subscription", metavar="SUB", help="the subscription id, sub_... (default: a new one)")
@click.option(
    "--billing-reason",
    type=click.Choice(("subscription_create", "subscription_cycle", "subscription_update", "manual")),
    default="subscription_cycle",
    show_default=True,
    help="invoice.*: why the invoice was made (subscription_create is the same sale as its checkout)",
)
@click.option(
    "--created", metavar="WHEN", help="when it happened: YYYY-MM-DD or an RFC 3339 time (default: now)"
)
@click.option("--test-mode", is_flag=True, help="send livemode: false (stored, never commissioned)")
@click.option(
    "--api-version",
    default=events.API_VERSION,
    show_default=True,
    help="the event's API version; invoices before 2025-03-31 take the legacy layout",
)
@click.option("--dry-run", is_flag=True, help="print the event and its Stripe-Signature header; send nothing")
@json_option("the event sent and the server's answer")
def trigger(event_type: str, url: str | None, secret: str | None, **o: Any) -> None:
    """Build a realistic Stripe event of EVENT_TYPE, sign it with the webhook secret the server
    has (`Stripe-Signature: t=...,v1=...`, as Stripe signs) and post it to the server's
    /webhooks/stripe. Route it with --program (metadata.program_id) or --stripe-account;
    attribute it with --aff, --click-id or --customer-key."""
    secret = secret or events.configured_secret()
    if not secret:
        raise AuthError(
            "no signing secret: set TALLY_STRIPE_WEBHOOK_SECRETS as the server has it, or pass --secret"
        )
    target = server_url(url)
    metadata = _metadata(o["pairs"])
    if o["aff"]:
        if not o["program"] or o["dry_run"]:
            raise click.UsageError("--aff records a click: it needs --program, and not --dry-run")
        o["click_id"] = record_click(target, o["program"], o["aff"])
    for key, option in (
        (META_PROGRAM_ID, "program"),
        (META_CLICK_ID, "click_id"),
        (META_CUSTOMER_KEY, "customer_key"),
    ):
        if o[option]:
            metadata[key] = o[option]
    created = _created(o["created"])
    envelope = events.event(
        event_type,
        build(event_type, o, metadata, created),
        created=created,
        livemode=not o["test_mode"],
        account=o["stripe_account"],
        api_version=o["api_version"],
    )
    if o["dry_run"]:
        body = events.serialise(envelope)
        print(body.decode())
        print(f"Stripe-Signature: {sign(body, secret, int(datetime.now(UTC).timestamp()))}", file=sys.stderr)
        return
    try:
        with httpx.Client(timeout=30) as client:
            response = events.deliver(client, target, envelope, secret)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise unreachable(target, exc) from None
    if response.status_code >= 400:
        error = api_error(response)
        if error.code == "invalid_signature":
            raise AuthError(f"{error}: is the secret the server's TALLY_STRIPE_WEBHOOK_SECRETS?") from None
        raise error
    answer = response.json()["data"]
    if o["as_json"]:
        emit({"event": envelope, "response": answer, "transaction_id": extract(envelope)["transaction_id"]})
        return
    _say(event_type, envelope, answer, target)
