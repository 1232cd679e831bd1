"""The dashboard's settings form conversion (percent -> basis points, money -> minor units by the
currency's decimals) and the human labels of codes and times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from api.forms import (
    bps_to_percent,
    money_for_form,
    money_to_minor,
    per_currency_rows,
    percent_to_bps,
    row_names,
    setting_rows,
    settings_data,
    settings_problems,
)
from api.pages import label, money, when
from ingest.domain.errors import ValidationFailed
from reports.labels import CODE_LABELS, code_label, date_text


@pytest.mark.parametrize(
    ("typed", "bps"),
    [
        ("30", 3000),
        ("12.5", 1250),
        ("12.50", 1250),
        ("0.01", 1),
        ("0,5", 50),
        ("100", 10_000),
        ("", 0),
        (" 7 % ", 700),
        ("0", 0),
    ],
)
def test_percent_becomes_basis_points(typed: str, bps: int) -> None:
    assert percent_to_bps(typed) == bps


@pytest.mark.parametrize("typed", ["lots", "100.01", "101", "12.345", "-1", "1e2", "1000", ".5", "30%%"])
def test_what_is_not_a_percentage_is_refused(typed: str) -> None:
    with pytest.raises(ValueError):
        percent_to_bps(typed)


@pytest.mark.parametrize("bps", [0, 1, 10, 99, 100, 1250, 3000, 3333, 10_000])
def test_basis_points_shown_as_percent_read_back_the_same(bps: int) -> None:
    assert percent_to_bps(bps_to_percent(bps)) == bps
    assert bps_to_percent(3000) == "30" and bps_to_percent(1250) == "12.5" and bps_to_percent(1) == "0.01"


@pytest.mark.parametrize(
    ("typed", "currency", "minor"),
    [
        ("12.50", "usd", 1250),
        ("12.5", "usd", 1250),
        ("12", "usd", 1200),
        ("1,000.25", "eur", 100_025),
        ("500", "jpy", 500),
        ("1,500", "krw", 1500),
        ("1.250", "kwd", 1250),
        ("0.005", "bhd", 5),
        ("12.5", "kwd", 12_500),
        ("12.50 USD", "usd", 1250),
        ("", "usd", 0),
        ("10000000000", "usd", 10**12),
    ],
)
def test_money_becomes_minor_units_by_the_currencys_decimals(typed: str, currency: str, minor: int) -> None:
    assert money_to_minor(typed, currency) == minor
    assert money_to_minor(money_for_form(minor, currency), currency) == minor


@pytest.mark.parametrize(
    ("typed", "currency", "message"),
    [
        ("12.345", "usd", "at most 2 decimals"),
        ("1.5", "jpy", "no decimals"),
        ("1.2345", "kwd", "at most 3 decimals"),
        ("12,50", "usd", "a dot before the decimals"),
        ("-5", "usd", "enter an amount"),
        ("abc", "usd", "enter an amount"),
        ("10000000000.01", "usd", "at most"),
    ],
)
def test_what_is_not_an_amount_of_the_currency_is_refused(typed: str, currency: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        money_to_minor(typed, currency)


def test_money_for_the_form_has_the_currencys_decimals() -> None:
    assert [money_for_form(1250, c) for c in ("usd", "jpy", "kwd")] == ["12.50", "1250", "1.250"]


def test_the_form_becomes_the_services_input_in_basis_points_and_minor_units() -> None:
    form = {
        "name": " Shop ",
        "commission_type": "flat",
        "commission_percent": "12.5",
        "commission_flat": "2.500",
        "flat_currency": "kwd",
        "platform_fee_percent": "1.25",
        "recurring_months": "",
        "holding_days": "14",
        "requires_server_side_leads": "on",
        "stripe_account_id": "",
        "payout_minimum": "50",
        "minimum_currency": "jpy",
        "website_url": " https://brand.test ",
    }
    assert settings_data(form) == {
        "name": "Shop",
        "commission_type": "flat",
        "commission_bps": 1250,
        "platform_fee_bps": 125,
        "commission_flat": {"kwd": 2500},  # in KWD alone (CONTRACT 15)
        "recurring_months": None,
        "holding_days": 14,
        "requires_server_side_leads": True,
        "stripe_account_id": None,
        "payout_minimum": {"jpy": 50},  # 50 yen: minor units as they are
        "website_url": "https://brand.test",
    }
    assert settings_data({**form, "minimum_currency": "usd"})["payout_minimum"] == {"usd": 5_000}
    blank = settings_data({**form, "website_url": "", "payout_minimum": ""})
    assert (blank["website_url"], blank["payout_minimum"]) == (None, 0)  # no row: 0 in every currency
    with pytest.raises(ValidationFailed) as caught:  # never read as some other currency
        settings_data({**form, "flat_currency": "nope"})
    assert settings_problems(caught.value) == {"commission_flat": "choose the currency of 2.500"}


def test_per_currency_settings_are_rows_of_an_amount_and_a_currency() -> None:
    """CONTRACT 15: one row per currency makes an object by currency, in each currency's
    decimals; one `every` row an integer of minor units; blank rows are left out."""
    rows = {
        "commission_flat": "12.50",
        "flat_currency": "usd",
        "commission_flat_2": "500",
        "flat_currency_2": "JPY",
        "commission_flat_3": "",
        "flat_currency_3": "eur",
        "commission_flat_4": "0.005",
        "flat_currency_4": "bhd",
        "payout_minimum": "1,000",
        "minimum_currency": "every",
    }
    data = settings_data(rows)
    assert data["commission_flat"] == {"bhd": 5, "jpy": 500, "usd": 1250}
    assert data["payout_minimum"] == 1000  # minor units, the same number in every currency
    assert per_currency_rows({"commission_flat": "", "flat_currency": "every"}, "commission_flat") == 0
    assert per_currency_rows({"commission_flat": "0", "flat_currency": "sek"}, "commission_flat") == {
        "sek": 0
    }
    # rows past a gap are not read: a form holds rows 1..n
    assert per_currency_rows({"commission_flat_3": "9", "flat_currency_3": "usd"}, "commission_flat") == 0
    for form, said in (
        (
            {
                "commission_flat": "5",
                "flat_currency": "every",
                "commission_flat_2": "1",
                "flat_currency_2": "usd",
            },
            "cannot be combined",
        ),
        (
            {
                "commission_flat": "5",
                "flat_currency": "usd",
                "commission_flat_2": "6",
                "flat_currency_2": "usd",
            },
            "USD is given twice",
        ),
        ({"commission_flat": "5.00", "flat_currency": "every"}, "whole minor units"),
        ({"commission_flat": "1000000000001", "flat_currency": "every"}, "at most 1000000000000"),
        ({"commission_flat": "5", "flat_currency": ""}, "choose the currency of 5"),
        ({"commission_flat": "1.5", "flat_currency": "jpy"}, "JPY amounts have no decimals"),
    ):
        with pytest.raises(ValueError, match=said):
            per_currency_rows(form, "commission_flat")


def test_the_form_shows_a_setting_as_its_rows() -> None:
    assert setting_rows(5000) == [{"amount": "5000", "currency": "every"}, {"amount": "", "currency": ""}]
    assert setting_rows({"jpy": 500, "usd": 1250}) == [
        {"amount": "500", "currency": "jpy"},
        {"amount": "12.50", "currency": "usd"},
        {"amount": "", "currency": ""},
    ]
    assert row_names("payout_minimum", 0) == ("payout_minimum", "minimum_currency")
    assert row_names("payout_minimum", 2) == ("payout_minimum_3", "minimum_currency_3")


def test_every_field_that_cannot_be_converted_is_named_on_the_form() -> None:
    form = {
        "commission_percent": "lots",
        "platform_fee_percent": "200",
        "commission_flat": "1.5",
        "flat_currency": "jpy",
    }
    with pytest.raises(ValidationFailed) as caught:
        settings_data(form)
    found = settings_problems(caught.value)
    assert set(found) == {"commission_percent", "platform_fee_percent", "commission_flat"}
    assert "at most 100 %" in found["platform_fee_percent"] and "no decimals" in found["commission_flat"]
    # the service's own refusals name the form's inputs, not basis points
    service = ValidationFailed("no", fields=[{"field": "commission_bps", "message": "too big"}])
    assert settings_problems(service) == {"commission_percent": "too big"}


def test_codes_have_labels_and_unknown_codes_are_humanised() -> None:
    assert code_label("rule", "processor_customer") == "Earlier sale of the same customer"
    assert code_label("reason", "lead_provisional") == "Lead not yet confirmed"
    assert code_label("status", "held") == "Held"
    assert code_label("step", "processor_event_received") == "Payment-processor event received"
    assert code_label("outcome", "rate_limited") == "Rate limited"  # an error code without a label
    for kind, labels in CODE_LABELS.items():
        for code, text in labels.items():
            assert text and text != code, (kind, code)
    html = str(label("reason", "click_not_found"))
    assert html == '<span class="code-label" title="click_not_found">Click not found</span>'
    escaped = "&lt;b&gt;&#34;x&#34;&lt;/b&gt;"
    assert (
        str(label("outcome", '<b>"x"</b>')) == f'<span class="code-label" title="{escaped}">{escaped}</span>'
    )

    assert str(label("rule", None)) == "—"


def test_times_show_as_dates_with_the_timestamp_on_hover() -> None:
    moment = datetime(2026, 1, 2, 23, 30, 59, tzinfo=timezone(timedelta(hours=-2)))  # 3 Jan 01:30 UTC
    assert date_text(moment) == "3 Jan 2026, 01:30 UTC" and date_text(moment, False) == "3 Jan 2026"
    assert str(when(moment)) == (
        '<time datetime="2026-01-03T01:30:59Z" title="2026-01-03T01:30:59Z">3 Jan 2026, 01:30 UTC</time>'
    )
    assert str(when(None)) == "—"
    assert date_text(datetime(2026, 12, 31, 0, 0, tzinfo=UTC)) == "31 Dec 2026, 00:00 UTC"


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (12_345, "kwd", "12.345 KWD"),
        (-1_500, "bhd", "-1.500 BHD"),
        (1234, "usd", "12.34 USD"),
        (500, "jpy", "500 JPY"),
        (None, "usd", "—"),
        (7, None, "7 XXX"),
    ],
)
def test_the_dashboard_formats_money_with_the_reports_formatter(
    amount: int | None, currency: str | None, text: str
) -> None:
    assert money(amount, currency) == text
