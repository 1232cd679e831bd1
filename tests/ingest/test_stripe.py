"""ingest/stripe.py: typed-field extraction from real public payloads, and body parsing."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ingest.domain.bounds import MAX_AMOUNT
from ingest.domain.errors import InvalidJson, InvalidSignature
from ingest.storage.schema import RAW_EVENT_FIELDS
from ingest.stripe import (
    STRIPE_FIELDS,
    _lone_surrogate,
    _long_digits,
    extract,
    parse_event,
    sign,
    verify_signature,
)
from tests.hypothesis_profiles import examples
from tests.stripe_fixtures import (
    FIXTURES_DIR,
    TEMPLATE_NAME,
    fixture_names,
    load_event,
    serialise,
    signed_delivery,
    with_metadata,
)

ATTRIBUTION = {"svc_click_id": "clk_abc", "svc_customer_key": "user_42", "program_id": "prog_1"}


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def test_fixture_dir_holds_every_documented_payload() -> None:
    names = fixture_names()
    assert len(names) == 40
    assert (FIXTURES_DIR / "README.md").is_file()
    assert all(name in (FIXTURES_DIR / "README.md").read_text() for name in names)


@pytest.mark.parametrize("name", fixture_names())
def test_every_fixture_extracts_to_schema_typed_fields(name: str) -> None:
    event = load_event(name)
    fields = extract(event)
    assert tuple(fields) == STRIPE_FIELDS
    assert set(fields) <= set(RAW_EVENT_FIELDS)
    assert fields["event_id"] == event["id"]
    assert fields["event_type"] == event["type"]
    assert fields["object_id"] == event["data"]["object"].get("id")
    assert fields["test_mode"] is (event["livemode"] is False)
    occurred = fields["occurred_at"]
    assert isinstance(occurred, datetime)
    assert occurred.utcoffset() is not None
    for key in ("amount", "tax"):
        assert fields[key] is None or type(fields[key]) is int
    assert fields["currency"] in (None, (fields["currency"] or "").lower())
    # And the re-serialised body parses back to the same event.
    assert parse_event(serialise(event)) == event


def test_checkout_session_live_with_invoice_and_tax() -> None:
    fields = extract(load_event("stripe-sync-engine__checkout_session_completed.json"))
    assert fields == {
        "event_id": "evt_T8nSaZqtPudigUMqnnbY4D4v",
        "event_type": "checkout.session.completed",
        "object_id": "cs_live_9RBjcHiy2i5p99Tf1MYM90c3SHK1grU0E6Ae6pKWR2KPA4ZiuKiB2X1Y3X",
        "livemode": True,
        "test_mode": False,
        "occurred_at": at(1619697430),
        "transaction_id": "in_1KJqKBJDPojXS6LNJbvLUgEy",
        "invoice_id": "in_1KJqKBJDPojXS6LNJbvLUgEy",
        "payment_intent_id": "pi_1IqxJOJDPojXS6LN9uOebAea",
        "checkout_session_id": "cs_live_9RBjcHiy2i5p99Tf1MYM90c3SHK1grU0E6Ae6pKWR2KPA4ZiuKiB2X1Y3X",
        "charge_id": None,
        "subscription_id": None,
        "billing_reason": None,
        "checkout_mode": "payment",
        "customer_key": None,
        "processor_customer_id": "cus_IhGfebO16cMIGN",
        "email": "billz@supabase.io",
        "click_id": None,
        "meta_program_id": None,
        "sub_metadata_present": False,
        "amount": 999,
        "tax": 65,
        "currency": "eur",
        "refund_id": None,
        "stripe_account": None,
        "promo_code": None,  # `discounts: []`
    }


def _with_discounts(name: str, **fields: Any) -> dict[str, Any]:
    event = copy.deepcopy(load_event(name))
    event["data"]["object"].update(fields)
    return event


def test_a_checkout_names_its_promotion_code_in_every_layout() -> None:
    """CONTRACT 14: `discounts[].promotion_code` names the promotion code (a string id, or the
    expanded object); a coupon applied without a code names none. The 2020-03-02 session of
    stripe-sync-engine has `discounts: []`; the 2020-08-27 one of stripe-ruby-mock (the legacy
    layout) has no `discounts` at all, only `total_details.breakdown` once expanded."""
    current = "stripe-sync-engine__checkout_session_completed.json"
    legacy = "stripe-ruby-mock__checkout.session.completed.json"
    cases = [
        (
            _with_discounts(current, discounts=[{"coupon": "co_1", "promotion_code": "promo_1Abc"}]),
            "promo_1Abc",
        ),
        (
            _with_discounts(current, discounts=[{"promotion_code": {"id": "promo_2", "code": "SAVE"}}]),
            "promo_2",
        ),
        (
            _with_discounts(
                current, discounts=[{"coupon": "co_1", "promotion_code": None}, {"promotion_code": "promo_3"}]
            ),
            "promo_3",
        ),
        (_with_discounts(current, discounts=[{"coupon": "co_1", "promotion_code": None}]), None),
        (load_event(legacy), None),
        (
            _with_discounts(
                legacy,
                total_details={
                    "amount_discount": 500,
                    "amount_tax": 0,
                    "breakdown": {
                        "discounts": [
                            {"amount": 500, "discount": {"id": "di_1", "promotion_code": "promo_4"}}
                        ],
                        "taxes": [],
                    },
                },
            ),
            "promo_4",
        ),
        (_with_discounts(current, discounts="promo_x"), None),  # not a list: nothing
        (_with_discounts(current, discounts=[{"promotion_code": ""}, 7]), None),
    ]
    for event, expected in cases:
        assert extract(event)["promo_code"] == expected, event["data"]["object"].get("discounts")
    invoice = load_event("pay__invoice.json")  # an invoice's discounts are `di_...` ids: never a code
    assert extract(invoice)["promo_code"] is None


def test_checkout_session_without_invoice_uses_payment_intent_then_session() -> None:
    paid = extract(load_event("stripe-ruby-mock__checkout.session.completed.json"))
    assert paid["transaction_id"] == "pi_000000000000000000000000"
    assert (paid["amount"], paid["tax"], paid["email"]) == (3000, 0, "stripe@example.com")
    setup = extract(load_event("stripe-ruby-mock__checkout.session.completed.setup_mode.json"))
    assert setup["transaction_id"] == "cs_00000000000000"
    assert (setup["checkout_mode"], setup["amount"], setup["currency"]) == ("setup", None, None)


def test_checkout_subscription_mode_with_session_metadata() -> None:
    event = load_event("pay__checkout.session.completed.json", account="acct_brand1")
    fields = extract(with_metadata(event, ATTRIBUTION, where="object"))
    assert fields["transaction_id"] == "cs_test_a1UejXx8ebIdTzFolicVypUAZpOBVkoQKDbaarXoPlPVtj8p0zujPEEhjT"
    assert fields["subscription_id"] == "sub_1LNkeSKXBGcbgpbZ7jMqOPSi"
    assert fields["checkout_mode"] == "subscription"
    assert (fields["customer_key"], fields["click_id"], fields["meta_program_id"]) == (
        "user_42",
        "clk_abc",
        "prog_1",
    )
    assert fields["sub_metadata_present"] is True
    assert (fields["amount"], fields["tax"], fields["email"]) == (1900, 0, "chris@gorails.com")
    assert fields["stripe_account"] == "acct_brand1"
    assert fields["occurred_at"] == at(1_700_000_000)  # the wrapper's `created`


def test_async_payment_succeeded_is_read_like_completed() -> None:
    event = load_event(
        "stripe-ruby-mock__checkout.session.completed.payment_mode.json",
        event_type="checkout.session.async_payment_succeeded",
    )
    event["data"]["object"]["customer_details"] = None
    event["data"]["object"]["customer_email"] = "fallback@example.com"
    fields = extract(event)
    assert fields["transaction_id"] == "pi_00000000000000"
    assert (fields["amount"], fields["email"]) == (25000, "fallback@example.com")


def test_legacy_invoice_paid_subscription_cycle() -> None:
    fields = extract(load_event("stripe-sync-engine__invoice_paid.json"))
    assert fields["transaction_id"] == "in_1KJqKBJDPojXS6LNJbvLUgEy"
    assert fields["invoice_id"] == "in_1KJqKBJDPojXS6LNJbvLUgEy"
    assert fields["subscription_id"] == "sub_JsuPyCPhXWfZar"
    assert fields["billing_reason"] == "subscription_cycle"
    assert (fields["amount"], fields["tax"], fields["currency"]) == (0, None, "usd")
    assert (fields["payment_intent_id"], fields["charge_id"]) == (None, None)
    assert fields["occurred_at"] == at(1642649110)  # status_transitions.paid_at, not created
    assert fields["sub_metadata_present"] is False
    assert fields["customer_key"] is None


def test_legacy_invoice_with_charge_intent_and_tax() -> None:
    fields = extract(load_event("dj-stripe__invoice_in_fakefakefakefakefake0001.json"))
    assert fields["transaction_id"] == "in_fakefakefakefakefake0001"
    assert fields["payment_intent_id"] == "pi_fakefakefakefakefake0001"
    assert fields["charge_id"] == "ch_fakefakefakefakefake0001"
    assert fields["subscription_id"] == "sub_fakefakefakefakefake0001"
    assert fields["billing_reason"] == "subscription_create"
    assert (fields["amount"], fields["tax"]) == (2000, 261)
    assert fields["email"] == "michael.smith@example.com"
    assert fields["processor_customer_id"] == "cus_6lsBvm5rJ0zyHc"
    assert fields["occurred_at"] == at(1593225983)


def test_new_layout_invoice_from_go_foks_template() -> None:
    fields = extract(load_event(TEMPLATE_NAME))
    assert fields["event_id"] == "evt_foks_0000000000000001"
    assert fields["event_type"] == "invoice.payment_succeeded"
    assert fields["transaction_id"] == "in_foks_0000000000000001"
    assert fields["subscription_id"] == "sub_foks_0000000000000001"  # parent.subscription_details
    assert fields["billing_reason"] == "subscription_create"
    assert (fields["amount"], fields["tax"]) == (190, 0)  # tax: sum of an empty total_taxes
    assert (fields["payment_intent_id"], fields["charge_id"]) == (None, None)
    assert (fields["livemode"], fields["test_mode"]) == (False, True)  # envelope wins
    assert fields["email"] == "renewal@example.com"
    assert fields["occurred_at"] == at(1745000000)
    assert fields["sub_metadata_present"] is False


def test_hybrid_invoice_tax_and_null_parent() -> None:
    fields = extract(load_event("pay__invoice.json"))
    assert (fields["amount"], fields["tax"], fields["currency"]) == (24512, 1805, "usd")
    assert fields["payment_intent_id"] == "pi_3RFFrjKXBGcbgpbZ0mAQxeI1"
    assert fields["charge_id"] == "ch_3RFFrjKXBGcbgpbZ0g57Qovb"
    assert fields["subscription_id"] is None
    assert fields["billing_reason"] == "manual"
    assert fields["email"] == "missouri@example.org"
    assert fields["occurred_at"] == at(1744986363)


def test_invoice_tax_from_total_taxes_when_tax_is_absent() -> None:
    event = load_event("pay__invoice.json")
    obj = event["data"]["object"]
    del obj["tax"]
    obj["total_taxes"] = [{"amount": 1000}, {"amount": 805}]
    assert extract(event)["tax"] == 1805
    obj["total_taxes"] = [{"amount": 1000}, {"amount": 80.5}]
    assert extract(event)["tax"] is None
    obj["total_taxes"] = None
    assert extract(event)["tax"] is None


def test_openapi_basil_invoice_subscription_string_in_parent() -> None:
    fields = extract(load_event("openapi__fixtures3.invoice.json"))
    assert fields["subscription_id"] == "subscription"
    assert (fields["amount"], fields["tax"], fields["transaction_id"]) == (
        0,
        None,
        "in_1Pgc6tB7WZ01zgkWu9fdqL6I",
    )
    assert fields["occurred_at"] == at(1234567890)  # paid_at null -> event created


def test_subscription_id_given_as_expanded_objects() -> None:
    legacy = load_event("stripe-sync-engine__invoice_paid.json")
    legacy["data"]["object"]["subscription"] = {"id": "sub_legacy_obj", "object": "subscription"}
    assert extract(legacy)["subscription_id"] == "sub_legacy_obj"
    new = load_event(TEMPLATE_NAME)
    new["data"]["object"]["parent"]["subscription_details"]["subscription"] = {"id": "sub_new"}
    new["data"]["object"]["subscription"] = "sub_ignored_when_parent_has_one"
    assert extract(new)["subscription_id"] == "sub_new"


def test_new_layout_payment_intent_from_payments_list() -> None:
    event = load_event(TEMPLATE_NAME)
    event["data"]["object"]["payments"] = {
        "object": "list",
        "data": [
            {"status": "canceled", "payment": {"type": "payment_intent", "payment_intent": "pi_x"}},
            {
                "status": "paid",
                "payment": {"type": "payment_intent", "payment_intent": {"id": "pi_paid"}},
            },
        ],
    }
    fields = extract(event)
    assert fields["payment_intent_id"] == "pi_paid"
    assert fields["transaction_id"] == "in_foks_0000000000000001"


@pytest.mark.parametrize(
    ("where", "layout_name"),
    [
        ("parent", TEMPLATE_NAME),
        ("legacy", "stripe-sync-engine__invoice_paid.json"),
        ("parent", "pay__invoice.json"),
        ("legacy", "pay__invoice.json"),
    ],
)
def test_invoice_subscription_metadata_gives_attribution(where: Any, layout_name: str) -> None:
    event = with_metadata(load_event(layout_name), ATTRIBUTION, where=where)
    fields = extract(event)
    assert (fields["customer_key"], fields["click_id"], fields["meta_program_id"]) == (
        "user_42",
        "clk_abc",
        "prog_1",
    )
    assert fields["sub_metadata_present"] is True


def test_invoice_new_metadata_path_wins_over_legacy() -> None:
    event = with_metadata(load_event("pay__invoice.json"), {"svc_customer_key": "old"}, "legacy")
    event = with_metadata(event, {"svc_customer_key": "new"}, where="parent")
    assert extract(event)["customer_key"] == "new"
    # An empty new-layout metadata falls back to the legacy one.
    event["data"]["object"]["parent"]["subscription_details"]["metadata"] = {}
    assert extract(event)["customer_key"] == "old"


def test_invoice_own_metadata_is_not_subscription_metadata() -> None:
    event = with_metadata(load_event("pay__invoice.json"), ATTRIBUTION, where="object")
    fields = extract(event)
    assert (fields["customer_key"], fields["sub_metadata_present"]) == (None, False)


def test_charge_refunded_with_invoice() -> None:
    fields = extract(load_event("stripe-sync-engine__charge_refunded.json"))
    assert fields["transaction_id"] == "in_1KJdKkJDPojXS6LNSwSWkZSN"
    assert fields["charge_id"] == "ch_3Kl36gJDPojXS6LN0DCM4A8l"
    assert fields["payment_intent_id"] == "pi_3Kl36gJDPojXS6LN02fQVtKR"
    assert (fields["amount"], fields["currency"]) == (2500, "usd")
    assert fields["refund_id"] == "re_3Kl36gJDPojXS6LN0eP4yPDz"
    assert fields["sub_metadata_present"] is None


BASIL_LINK = "tally__invoice_payment.paid.basil.json"


@pytest.mark.parametrize(
    ("name", "invoice_id", "payment_intent_id"),
    [
        (BASIL_LINK, "in_1RBasilRenewal00000001", "pi_3RBasilRenewal0000001"),
        (
            "stripe-sync-engine__invoice_payment_paid.json",
            "in_103Q0w2eZvKYlo2C5PYwf6Wf",
            "pi_103Q0w2eZvKYlo2C364X582Z",
        ),
    ],
)
def test_invoice_payment_paid_links_its_invoice_to_its_payment_intent(
    name: str, invoice_id: str, payment_intent_id: str
) -> None:
    event = load_event(name)
    fields = extract(event)
    assert fields["event_type"] == "invoice_payment.paid"
    assert fields["object_id"] == event["data"]["object"]["id"]
    assert (fields["invoice_id"], fields["payment_intent_id"]) == (invoice_id, payment_intent_id)
    assert (fields["transaction_id"], fields["charge_id"]) == (invoice_id, None)
    # a link is no sale and no refund: no amount to count, nothing to claim
    assert (fields["amount"], fields["refund_id"], fields["checkout_session_id"]) == (None, None, None)


def test_invoice_payment_paid_by_a_charge_or_oddly_shaped() -> None:
    event = load_event(BASIL_LINK)
    obj = event["data"]["object"]
    obj["payment"] = {"type": "charge", "charge": {"id": "ch_basil", "object": "charge"}}
    obj["invoice"] = {"id": "in_expanded", "object": "invoice"}
    fields = extract(event)
    assert (fields["invoice_id"], fields["payment_intent_id"], fields["charge_id"]) == (
        "in_expanded",
        None,
        "ch_basil",
    )
    obj["payment"] = "pi_not_an_object"
    obj["invoice"] = 42
    fields = extract(event)
    assert (fields["invoice_id"], fields["payment_intent_id"], fields["charge_id"]) == (None, None, None)


def test_charge_partially_refunded_cumulative_amount() -> None:
    fields = extract(load_event("pay__charge.refunded.json"))
    assert (fields["amount"], fields["refund_id"]) == (500, "re_3LQOJoKXBGcbgpbZ10i9Mg75")
    assert fields["transaction_id"] == "pm_1234"
    assert fields["processor_customer_id"] == "cus_0dUMWLtzCTagWs"


def test_charge_refunded_without_invoice_or_intent_falls_back_to_charge() -> None:
    fields = extract(load_event("stripe-ruby-mock__charge.refunded.json"))
    assert fields["transaction_id"] == "ch_000000000000000000000000"
    assert (fields["amount"], fields["refund_id"]) == (100, "re_000000000000000000000000")


def test_newest_refund_is_picked_by_created() -> None:
    event = load_event("pay__charge.refunded.json")
    event["data"]["object"]["refunds"]["data"] = [
        {"id": "re_old", "created": 100},
        {"id": "re_new", "created": 300},
        {"id": "re_mid", "created": 200},
        "garbage",
    ]
    assert extract(event)["refund_id"] == "re_new"


def test_subscription_events_read_subscription_metadata() -> None:
    event = load_event("stripe-sync-engine__subscription_created.json")
    fields = extract(with_metadata(event, ATTRIBUTION))
    assert fields["subscription_id"] == "sub_JdIzvfy6o5GZRd"
    assert fields["processor_customer_id"] == "cus_IhGfebO16cMIGN"
    assert (fields["customer_key"], fields["click_id"], fields["meta_program_id"]) == (
        "user_42",
        "clk_abc",
        "prog_1",
    )
    assert fields["sub_metadata_present"] is True
    bare = extract(load_event("pay__subscription.updated.json"))
    assert (bare["subscription_id"], bare["sub_metadata_present"]) == ("sub_00000000000000", False)


def test_other_events_keep_envelope_fields_only() -> None:
    fields = extract(load_event("stripe-sync-engine__charge_succeeded.json"))
    assert {k: v for k, v in fields.items() if v is not None} == {
        "event_id": "evt_3KtQThJDPojXS6LN0E06aNxq",
        "event_type": "charge.succeeded",
        "object_id": "ch_3KtQThJDPojXS6LN0YmgbxGj",
        "livemode": False,
        "test_mode": True,
        "occurred_at": at(1619701111),
        "processor_customer_id": "cus_J7Mkgr8mvbl1eK",
    }
    account = extract(load_event("dj-stripe__event_account_updated_standard.json"))
    assert account["stripe_account"] == "acct_1Fg9jUA3kq9o1aTc"
    assert account["amount"] is None


def test_odd_shapes_give_nulls() -> None:
    event = load_event("stripe-sync-engine__checkout_session_completed.json")
    obj = event["data"]["object"]
    obj.update(
        amount_total=99.5,
        total_details={"amount_tax": True},
        currency="EUR",
        invoice={"id": "in_expanded"},
        payment_intent=12,
        customer={"id": "cus_expanded"},
        metadata={"svc_customer_key": 7, "svc_click_id": "", "program_id": "prog_x"},
    )
    event["livemode"] = "yes"
    event["created"] = 10**30
    fields = extract(event)
    assert (fields["amount"], fields["tax"], fields["currency"]) == (None, None, "eur")
    assert (fields["invoice_id"], fields["payment_intent_id"]) == ("in_expanded", None)
    assert fields["processor_customer_id"] == "cus_expanded"
    assert (fields["customer_key"], fields["click_id"], fields["meta_program_id"]) == (
        None,
        None,
        "prog_x",
    )
    assert (fields["livemode"], fields["test_mode"], fields["occurred_at"]) == (None, False, None)


@pytest.mark.parametrize(
    "event",
    [
        {},
        {"data": None},
        {"data": []},
        {"type": "invoice.paid", "data": {"object": "in_1"}},
        {"type": "charge.refunded", "data": {"object": {"refunds": {"data": "x"}}}},
        {"type": "invoice.paid", "data": {"object": {"parent": "p", "payments": {"data": [1]}}}},
        {"type": ["x"], "id": 5, "account": {"id": "acct_obj"}},
    ],
)
def test_malformed_events_never_raise(event: dict[str, Any]) -> None:
    fields = extract(event)
    assert tuple(fields) == STRIPE_FIELDS
    assert fields["test_mode"] is False
    assert fields["amount"] is None


_KEYS: tuple[str, ...] = ("id", "object", "invoice", "subscription", "metadata", "parent", "amount_paid")
_KEYS += ("subscription_details", "refunds", "data", "payments", "payment", "created")
# every amount the extraction reads: checkout totals and tax, invoice totals and taxes, refunds
_KEYS += ("amount_total", "amount_refunded", "total_details", "amount_tax", "tax", "total_taxes", "amount")
_KEYS += ("discounts", "promotion_code", "breakdown", "discount")
_TYPES: tuple[str, ...] = ("checkout.session.completed", "invoice.paid", "charge.refunded")
_TYPES += ("customer.subscription.updated", "plan.created")
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(_KEYS),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


# Where each event type's amount is read from its object.
_AMOUNT_AT = {
    "checkout.session.completed": "amount_total",
    "invoice.paid": "amount_paid",
    "charge.refunded": "amount_refunded",
}
MAX, BEYOND = MAX_AMOUNT, MAX_AMOUNT + 1


@settings(max_examples=examples(200, ci=1000), deadline=None)
@given(
    event_type=st.sampled_from(_TYPES),
    obj=_json,
    created=_json,
)
# Amounts just beyond each end of the range, where the bounds are easiest to get wrong.
@example(event_type="checkout.session.completed", obj={"amount_total": -1}, created=None)
@example(event_type="checkout.session.completed", obj={"total_details": {"amount_tax": BEYOND}}, created=None)
@example(event_type="invoice.paid", obj={"amount_paid": BEYOND, "tax": -1}, created=None)
@example(event_type="invoice.paid", obj={"total_taxes": [{"amount": MAX}, {"amount": 1}]}, created=None)
@example(event_type="charge.refunded", obj={"amount_refunded": -1}, created=None)
def test_extract_is_total_on_arbitrary_json(event_type: str, obj: Any, created: Any) -> None:
    """Whatever the payload: every field is there, an amount or tax is None or an int within
    0..10^12, and the amount is the object's own when that is such an int (else None)."""
    fields = extract({"type": event_type, "created": created, "data": {"object": obj}})
    assert tuple(fields) == STRIPE_FIELDS
    assert fields["promo_code"] is None or (type(fields["promo_code"]) is str and fields["promo_code"])
    for key in ("amount", "tax"):
        assert fields[key] is None or (type(fields[key]) is int and 0 <= fields[key] <= MAX_AMOUNT)
    if event_type in _AMOUNT_AT and isinstance(obj, dict):
        own = obj.get(_AMOUNT_AT[event_type])
        assert fields["amount"] == (own if type(own) is int and 0 <= own <= MAX_AMOUNT else None)


def test_parse_event_accepts_objects_only() -> None:
    assert parse_event(b'{"id": "evt_1"}') == {"id": "evt_1"}
    for body in (b"", b"[1]", b'"x"', b"{", b"\xff\xfe\xfa", b"null", b"[" * 100_000):
        with pytest.raises(InvalidJson) as info:
            parse_event(body)
        assert info.value.code == "invalid_json"
    # any JSON object, whatever its layout, as the object it is
    assert parse_event(b' {\n "a" : [1, {"b": null}], "c": "\\u00e9"}\t') == {"a": [1, {"b": None}], "c": "é"}


def _stdlib_reading(body: bytes) -> object:
    """What parsing a delivery gave before orjson read it: the standard library's reader, and
    the same refusals (not JSON, not an object, a lone surrogate)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return InvalidJson
    if not isinstance(value, dict) or _lone_surrogate(value):
        return InvalidJson
    return value


_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        [
            "1e400",
            "-1e400",
            "1.5e-400",
            "-0",
            "-0.0",
            "1E5",
            "2.50",
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551616",
            "NaN",
            "Infinity",
            "01",
            "1.",
        ]
    ),
)
_TEXTS = st.text() | st.sampled_from(
    ["\\ud800", "\\udfff\\ud800", "\\ud83d\\ude00", "\\u0000", "evt_1234567890123456789"]
)


def _json_text(draw: st.DrawFn, depth: int = 0) -> str:
    kind = draw(st.integers(0, 5 if depth < 3 else 2))
    if kind == 0:
        n = draw(_NUMBERS)
        return n if isinstance(n, str) else json.dumps(n)
    if kind == 1:
        text = draw(_TEXTS)
        return '"' + text + '"' if text.startswith("\\u") or text.startswith("evt_") else json.dumps(text)
    if kind == 2:
        return draw(st.sampled_from(["true", "false", "null"]))
    if kind == 3:
        items = draw(st.lists(st.just(None), max_size=4))
        return "[" + ", ".join(_json_text(draw, depth + 1) for _ in items) + "]"
    keys = draw(st.lists(_TEXTS, max_size=4))
    return "{" + ",".join(json.dumps(k) + ":" + _json_text(draw, depth + 1) for k in keys) + "}"


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """JSON texts (objects mostly), with the numbers, escapes and prefixes where the two readers
    could differ, in UTF-8 or, now and then, in another encoding the standard reader detects."""
    keys = draw(st.lists(_TEXTS, max_size=5))
    text = "{" + ", ".join(json.dumps(k) + ": " + _json_text(draw, 1) for k in keys) + "}"
    text = draw(st.sampled_from(["", " ", "\n", "\ufeff"])) + text + draw(st.sampled_from(["", "\n", " x"]))
    if draw(st.booleans()):
        text = _json_text(draw)
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "utf-32"]))
    return text.encode(encoding, "surrogatepass")


@given(_bodies())
@settings(max_examples=examples(400), deadline=None)
@example(b'{"amount": 123456789012345678901234567890}')
@example(b'{"a": -9223372036854775809, "b": 18446744073709551615}')
@example(b'{"a": NaN}')
@example(b"\xef\xbb\xbf{}")
@example(b'{"a": "\\ud800"}')
@example(b'{"a": "\\ud83d\\ude00"}')
@example('{"a": "\\ud800"}'.encode("utf-16"))  # accepted until orjson read deliveries
def test_parse_event_reads_what_the_standard_reader_read(body: bytes) -> None:
    """orjson reads deliveries now: every body is accepted or refused as the standard library's
    reader did, and read as the same values (types included: a big integer stays an integer)."""
    expected = _stdlib_reading(body)
    if expected is InvalidJson:
        with pytest.raises(InvalidJson):
            parse_event(body)
        return
    got = parse_event(body)
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)  # the same types: 1 is not 1.0, ints stay ints


@given(
    st.lists(
        st.one_of(st.binary(max_size=8), st.text("0123456789", max_size=25).map(str.encode)), max_size=12
    ).map(b"".join)
)
@settings(max_examples=examples(300))
@example(b"1" * 19)
@example(b"1" * 18 + b"x" + b"1" * 18)
@example("\u0663".encode() * 19)  # an Arabic-Indic digit is not an ASCII one
@example(b"0" * 19)
def test_a_run_of_nineteen_digits_is_found_as_the_regular_expression_finds_it(body: bytes) -> None:
    """`_long_digits` (what sends a body with a big integer to the standard reader) finds
    exactly the runs `[0-9]{19}` finds."""
    assert _long_digits(body) == (re.search(rb"[0-9]{19}", body) is not None)


# --- signatures -------------------------------------------------------------------------------

SECRET = "whsec_test_current"
OLD_SECRET = "whsec_test_previous"
T = 1_763_700_000
NOW = datetime.fromtimestamp(T + 10, tz=UTC)
BODY = serialise(load_event("stripe-sync-engine__invoice_paid.json"))


def verify(header: str | None, secrets: Any = (SECRET,), now: datetime = NOW) -> int:
    return verify_signature(BODY, header, secrets, 300, now)


def test_sign_matches_stripe_scheme() -> None:
    # HMAC-SHA256("whsec_test_current", "1763700000.{}") computed independently.
    assert sign(b"{}", SECRET, T) == (
        "t=1763700000,v1=1dceedc8bc8a2a5024ef465cbcddb4a266ad233a54b2a4e798c8f2009535235f"
    )


def test_valid_signature_returns_timestamp() -> None:
    body, header = signed_delivery(load_event("stripe-sync-engine__invoice_paid.json"), SECRET, T)
    assert body == BODY
    assert verify(header) == T
    assert verify(header.replace(",", " , ")) == T


def test_any_of_several_v1_values_may_match() -> None:
    good = sign(BODY, SECRET, T).split("v1=")[1]
    header = f"t={T},v0=deadbeef,v1={'0' * 64},v1={good},v1=zz"
    assert verify(header) == T


def test_rolled_secrets_second_secret_accepted() -> None:
    header = sign(BODY, OLD_SECRET, T)
    assert verify(header, secrets=[SECRET, OLD_SECRET]) == T
    assert verify(header, secrets=OLD_SECRET) == T  # a lone string is one secret, not characters


@pytest.mark.parametrize(
    ("header", "secrets", "message"),
    [
        (sign(BODY, "whsec_wrong", T), (SECRET,), "matches a configured secret"),
        (sign(BODY + b" ", SECRET, T), (SECRET,), "matches a configured secret"),
        (None, (SECRET,), "missing Stripe-Signature header"),
        ("", (SECRET,), "missing Stripe-Signature header"),
        ("garbage", (SECRET,), "no t= timestamp"),
        ("t=abc,v1=00", (SECRET,), "bad timestamp"),
        ("t=-5,v1=00", (SECRET,), "bad timestamp"),
        (f"t={T}", (SECRET,), "no v1 signature"),
        (f"t={T},v0={sign(BODY, SECRET, T).split('v1=')[1]}", (SECRET,), "no v1 signature"),
        (sign(BODY, SECRET, T), (), "no webhook signing secret"),
        (sign(BODY, SECRET, T), ("",), "no webhook signing secret"),
    ],
)
def test_refused_signatures(header: str | None, secrets: Any, message: str) -> None:
    with pytest.raises(InvalidSignature) as info:
        verify(header, secrets=secrets)
    assert message in info.value.message
    assert info.value.code == "invalid_signature"
    assert SECRET not in str(info.value)


def test_stale_and_future_timestamps_refused_at_tolerance_edges() -> None:
    header = sign(BODY, SECRET, T)
    assert verify(header, now=datetime.fromtimestamp(T + 300, tz=UTC)) == T
    assert verify(header, now=datetime.fromtimestamp(T - 300, tz=UTC)) == T
    with pytest.raises(InvalidSignature, match="301s old"):
        verify(header, now=datetime.fromtimestamp(T + 301, tz=UTC))
    with pytest.raises(InvalidSignature, match="3600s in the future"):
        verify(header, now=datetime.fromtimestamp(T - 3600, tz=UTC))


def test_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="aware"):
        verify(sign(BODY, SECRET, T), now=datetime(2026, 1, 1))  # noqa: DTZ001
