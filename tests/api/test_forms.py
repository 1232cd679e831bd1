"""The dashboard's settings form conversion (percent -> basis points, money -> minor units by the
currency's decimals) and the human labels of codes and times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from api.forms import (
    bps_to_percent,
    money_for_form,
    money_to_minor,
    percent_to_bps,
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
        "commission_flat": 2500,
        "recurring_months": None,
        "holding_days": 14,
        "requires_server_side_leads": True,
        "stripe_account_id": None,
        "payout_minimum": 50,  # 50 yen: minor units as they are
        "website_url": "https://brand.test",
    }
    assert settings_data({**form, "flat_currency": "nope"})["commission_flat"] == 250  # read as usd: 2.50
    assert settings_data({**form, "minimum_currency": "usd"})["payout_minimum"] == 5_000
    assert settings_data({**form, "website_url": "", "payout_minimum": ""})["website_url"] is None


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
