"""bench/rawbodies: the `body` and `headers` columns of generated raw rows, rendered vectorised.

Each generated row names a template (`tpl`): processor deliveries get a Stripe-shaped event
(checkout session, invoice in the current `parent.subscription_details` layout or the legacy
top-level `subscription` layout, charge.refunded), track calls the JSON body the SDK sends.
Bodies are trimmed versions of real payloads (about 1.5-2 KB for processor events, 200-400 bytes
for track calls), built from the row's typed columns so the two agree. The reconciler reads
`body` only for engineer actions, whose bodies the generator writes itself (column `body`); the
rest is there so the database has the size and shape it has in production.

Placeholders: `<<q:col>>` JSON string or null, `<<n:col>>` number or null, `<<n0:col>>` number
or 0, `<<b:col>>` boolean or null, `<<t:col>>` epoch seconds, `<<iso:col>>` ISO-8601 UTC,
`<<s:col>>` raw text, `<<h:col>>` a 60-digit digest of the column, `<<meta:->>` the svc metadata
object (`svc_customer_key`, `svc_click_id`, `program_id`, nulls left out).
"""

from __future__ import annotations

import re

import polars as pl

from ingest.storage.schema import RAW_EVENT_FIELDS

_EVENT_HEAD = (
    '{"id":<<q:event_id>>,"object":"event","account":<<q:stripe_account>>,'
    '"api_version":"2025-03-31.basil","created":<<t:occurred_at>>,"data":{"object":'
)
_EVENT_TAIL = (
    '},"livemode":<<b:livemode>>,"pending_webhooks":1,'
    '"request":{"id":null,"idempotency_key":null},"type":<<q:event_type>>}'
)

SESSION = (
    _EVENT_HEAD + '{"id":<<q:object_id>>,"object":"checkout.session","adaptive_pricing":{"enabled":false},'
    '"after_expiration":null,"allow_promotion_codes":true,"amount_subtotal":<<n:amount>>,'
    '"amount_total":<<n:amount>>,"automatic_tax":{"enabled":true,"liability":null,"status":"complete"},'
    '"billing_address_collection":"auto","cancel_url":"https://brand.example/pricing",'
    '"client_reference_id":null,"consent":null,"created":<<t:occurred_at>>,"currency":<<q:currency>>,'
    '"customer":<<q:processor_customer_id>>,"customer_creation":"if_required","customer_details":'
    '{"address":{"city":"San Francisco","country":"US","line1":null,"line2":null,"postal_code":"94107",'
    '"state":"CA"},"email":<<q:email>>,"name":"Jenny Rosen","phone":null,"tax_exempt":"none",'
    '"tax_ids":[]},"customer_email":<<q:email>>,"expires_at":<<t:occurred_at>>,"invoice":<<q:invoice_id>>,'
    '"livemode":<<b:livemode>>,"locale":"auto","metadata":<<meta:->>,"mode":<<q:checkout_mode>>,'
    '"payment_intent":<<q:payment_intent_id>>,"payment_method_collection":"always",'
    '"payment_method_types":["card","link"],"payment_status":"paid","phone_number_collection":'
    '{"enabled":false},"status":"complete","submit_type":null,"subscription":<<q:subscription_id>>,'
    '"success_url":"https://brand.example/welcome?session_id={CHECKOUT_SESSION_ID}",'
    '"total_details":{"amount_discount":0,"amount_shipping":0,"amount_tax":<<n0:tax>>},'
    '"ui_mode":"hosted","url":null}' + _EVENT_TAIL
)

_INVOICE_BODY = (
    '{"id":<<q:object_id>>,"object":"invoice","account_country":"US","account_name":"Brand Inc.",'
    '"amount_due":<<n:amount>>,"amount_overpaid":0,"amount_paid":<<n:amount>>,"amount_remaining":0,'
    '"attempt_count":1,"attempted":true,"auto_advance":false,"billing_reason":<<q:billing_reason>>,'
    '"collection_method":"charge_automatically","created":<<t:occurred_at>>,"currency":<<q:currency>>,'
    '"customer":<<q:processor_customer_id>>,"customer_email":<<q:email>>,"customer_name":"Jenny Rosen",'
    '"default_payment_method":null,"description":null,"discounts":[],"ending_balance":0,'
    '"hosted_invoice_url":"https://invoice.stripe.com/i/<<s:stripe_account>>/<<s:object_id>>",'
    '"lines":{"object":"list","data":[{"id":"il_<<s:object_id>>","object":"line_item",'
    '"amount":<<n:amount>>,"currency":<<q:currency>>,"description":"1 x Pro (at monthly price)",'
    '"period":{"end":<<t:occurred_at>>,"start":<<t:occurred_at>>},"quantity":1}],"has_more":false,'
    '"total_count":1,"url":"/v1/invoices/<<s:object_id>>/lines"},"livemode":<<b:livemode>>,'
    '"number":"BRAND-0001","paid":true,"period_end":<<t:occurred_at>>,"period_start":<<t:occurred_at>>,'
    '"status":"paid","status_transitions":{"finalized_at":<<t:occurred_at>>,"marked_uncollectible_at":'
    'null,"paid_at":<<t:occurred_at>>,"voided_at":null},"subtotal":<<n:amount>>,"total":<<n:amount>>,'
    '"total_taxes":[{"amount":<<n0:tax>>,"tax_behavior":"exclusive","taxability_reason":"standard_rated"}],'
)
INVOICE = (
    _EVENT_HEAD + _INVOICE_BODY + '"parent":{"type":"subscription_details","quote_details":null,'
    '"subscription_details":{"metadata":<<meta:->>,"subscription":<<q:subscription_id>>}},'
    '"payments":{"object":"list","data":[{"id":"inpay_<<s:object_id>>","object":"invoice_payment",'
    '"payment":{"type":"payment_intent","payment_intent":<<q:payment_intent_id>>}}]}}' + _EVENT_TAIL
)
INVOICE_LEGACY = (
    _EVENT_HEAD + _INVOICE_BODY + '"charge":<<q:charge_id>>,"payment_intent":<<q:payment_intent_id>>,'
    '"subscription":<<q:subscription_id>>,"subscription_details":{"metadata":<<meta:->>}}' + _EVENT_TAIL
)
CHARGE_REFUNDED = (
    _EVENT_HEAD + '{"id":<<q:object_id>>,"object":"charge","amount_captured":<<n:amount>>,'
    '"amount_refunded":<<n:amount>>,"balance_transaction":"txn_<<s:object_id>>","captured":true,'
    '"created":<<t:occurred_at>>,"currency":<<q:currency>>,"customer":<<q:processor_customer_id>>,'
    '"invoice":<<q:invoice_id>>,"livemode":<<b:livemode>>,"paid":true,"payment_intent":'
    '<<q:payment_intent_id>>,"payment_method_details":{"card":{"brand":"visa","country":"US",'
    '"exp_month":8,"exp_year":2027,"funding":"credit","last4":"4242","network":"visa"},"type":"card"},'
    '"receipt_url":"https://pay.stripe.com/receipts/<<s:object_id>>","refunded":false,"refunds":'
    '{"object":"list","data":[{"id":<<q:refund_id>>,"object":"refund","amount":<<n:amount>>,'
    '"charge":<<q:object_id>>,"currency":<<q:currency>>,"reason":"requested_by_customer",'
    '"status":"succeeded"}],"has_more":false},"status":"succeeded"}' + _EVENT_TAIL
)

CLICK = (
    '{"click_id":<<q:click_id>>,"partner_code":<<q:partner_code>>,'
    '"url":"https://brand.example/pricing?via=<<s:partner_code>>&utm_source=partner",'
    '"referrer":"https://partner.example/best-tools-2025","user_agent":"Mozilla/5.0 (Macintosh; Intel '
    'Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15",'
    '"occurred_at":<<iso:occurred_at>>}'
)
LEAD = (
    '{"customer_external_id":<<q:customer_key>>,"email":<<q:email>>,"click_id":<<q:click_id>>,'
    '"status":<<q:lead_status>>,"name":"Jenny Rosen","occurred_at":<<iso:occurred_at>>}'
)
SALE = (
    '{"transaction_id":<<q:transaction_id>>,"amount":<<n:amount>>,"currency":<<q:currency>>,'
    '"customer_external_id":<<q:customer_key>>,"email":<<q:email>>,"click_id":<<q:click_id>>,'
    '"is_recurring":<<b:is_recurring>>,"sale_type":<<q:sale_type>>,"subscription_id":<<q:subscription_id>>,'
    '"occurred_at":<<iso:occurred_at>>,"additional_data":{"plan":"pro","test_mode":<<b:test_mode>>}}'
)
REFUND = (
    '{"transaction_id":<<q:transaction_id>>,"refund_id":<<q:refund_id>>,"amount":<<n:amount>>,'
    '"currency":<<q:currency>>,"reason":"requested_by_customer","occurred_at":<<iso:occurred_at>>}'
)

STRIPE_HEADERS = (
    '{"content-type":"application/json; charset=utf-8","user-agent":"Stripe/1.0 '
    '(+https://stripe.com/docs/webhooks)","stripe-signature":"t=<<t:received_at>>,v1=<<h:event_id>>",'
    '"x-request-id":"req_<<h:seq>>"}'
)
TRACK_HEADERS = (
    '{"content-type":"application/json","user-agent":"tally-python/0.4.0 CPython/3.12",'
    '"x-request-id":"req_<<h:seq>>"}'
)
ENGINEER_HEADERS = "{}"  # what ingest/actions.py writes

# tpl -> (body template, headers template); "engineer" rows bring their own body.
TEMPLATES: dict[str, tuple[str | None, str]] = {
    "session": (SESSION, STRIPE_HEADERS),
    "invoice": (INVOICE, STRIPE_HEADERS),
    "invoice_legacy": (INVOICE_LEGACY, STRIPE_HEADERS),
    "charge_refunded": (CHARGE_REFUNDED, STRIPE_HEADERS),
    "click": (CLICK, TRACK_HEADERS),
    "lead": (LEAD, TRACK_HEADERS),
    "sale": (SALE, TRACK_HEADERS),
    "refund": (REFUND, TRACK_HEADERS),
    "engineer": (None, ENGINEER_HEADERS),
}

_PLACEHOLDER = re.compile(r"<<([a-z0-9]+):([\w-]+)>>")
_META = (
    ("svc_customer_key", "customer_key"),
    ("svc_click_id", "click_id"),
    ("program_id", "meta_program_id"),
)


def _value(kind: str, name: str) -> pl.Expr:
    if kind == "meta":
        pairs = [pl.lit(f'"{key}":"') + pl.col(column) + pl.lit('"') for key, column in _META]
        return pl.lit("{") + pl.concat_str(pairs, separator=",", ignore_nulls=True) + pl.lit("}")
    col = pl.col(name)
    if kind == "q":
        return pl.coalesce(pl.lit('"') + col + pl.lit('"'), pl.lit("null"))
    if kind == "n":
        return col.cast(pl.String).fill_null("null")
    if kind == "n0":
        return col.fill_null(0).cast(pl.String)
    if kind == "b":
        return (
            pl.when(col.is_null())
            .then(pl.lit("null"))
            .when(col)
            .then(pl.lit("true"))
            .otherwise(pl.lit("false"))
        )
    if kind == "t":
        return col.dt.epoch("s").cast(pl.String)
    if kind == "iso":
        return pl.lit('"') + col.dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ") + pl.lit('"')
    if kind == "s":
        return col.cast(pl.String).fill_null("")
    if kind == "h":
        return pl.concat_str([col.hash(salt).cast(pl.String).str.zfill(20) for salt in (11, 12, 13)])
    raise ValueError(f"unknown placeholder kind {kind!r}")


def template(text: str) -> pl.Expr:
    """The expression that renders `text` for every row."""
    pieces = _PLACEHOLDER.split(text)
    exprs: list[pl.Expr] = []
    for i in range(0, len(pieces), 3):
        if pieces[i]:
            exprs.append(pl.lit(pieces[i]))
        if i + 2 < len(pieces):
            exprs.append(_value(pieces[i + 1], pieces[i + 2]))
    return pl.concat_str(exprs)


def render(events: pl.DataFrame) -> pl.DataFrame:
    """`events` (generated rows with `tpl` and engineer `body`) as rows of `raw_events`, in seq order."""
    parts = []
    for (tpl,), group in events.partition_by("tpl", as_dict=True).items():
        body, headers = TEMPLATES[str(tpl)]
        parts.append(
            group.with_columns(
                body=pl.col("body") if body is None else template(body), headers=template(headers)
            )
        )
    return pl.concat(parts).sort("seq").select(RAW_EVENT_FIELDS)
