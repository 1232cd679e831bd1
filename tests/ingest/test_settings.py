"""Program settings by currency (CONTRACT 15): `ProgramSettings.flat_commission_for` and
`payout_minimum_for`, the one reading of `commission_flat` and `payout_minimum` everyone uses,
and the stored form they round-trip through."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from ingest.domain.bounds import MAX_AMOUNT, MAX_CURRENCIES, per_currency
from ingest.domain.records import ProgramSettings


def test_an_integer_applies_to_every_currency() -> None:
    settings = ProgramSettings(commission_flat=500, payout_minimum=5000)
    for currency in ("usd", "EUR", "jpy", "kwd", "xyz", None):
        assert settings.flat_commission_for(currency) == 500
        assert settings.payout_minimum_for(currency) == 5000
    assert (
        ProgramSettings().flat_commission_for("usd") == 0 and ProgramSettings().payout_minimum_for("usd") == 0
    )


def test_an_object_applies_to_the_currencies_it_names() -> None:
    settings = ProgramSettings.model_validate(
        {"commission_flat": {"USD": 500, "jpy": 500, "eur": 0}, "payout_minimum": {"usd": 5000, "jpy": 5000}}
    )
    assert (settings.commission_flat, settings.payout_minimum) == (
        {"eur": 0, "jpy": 500, "usd": 500},
        {"jpy": 5000, "usd": 5000},
    )
    assert [settings.flat_commission_for(c) for c in ("usd", "USD", "jpy", "eur")] == [500, 500, 500, 0]
    # a currency the object does not name: no flat amount (the sale earns nothing) ...
    assert [settings.flat_commission_for(c) for c in ("gbp", "kwd", None)] == [None, None, None]
    # ... and no minimum: any positive balance in it is payable
    assert [settings.payout_minimum_for(c) for c in ("usd", "JPY", "eur", "gbp", None)] == [
        5000,
        5000,
        0,
        0,
        0,
    ]


@pytest.mark.parametrize("minimum", [5000, {"usd": 5000}])
def test_the_minimum_is_exact_at_its_edge(minimum: int | dict[str, int]) -> None:
    """The minimum is the amount itself, not one more nor one less: a balance of exactly 50.00
    USD meets a 50.00 USD minimum (the batch pays a balance at or above `payout_minimum_for`)."""
    settings = ProgramSettings(payout_minimum=minimum)
    assert settings.payout_minimum_for("usd") == 5000
    balance = 5000
    assert balance >= settings.payout_minimum_for("usd") and balance - 1 < settings.payout_minimum_for("usd")


def test_the_bounds_hold_for_each_amount_and_the_number_of_currencies() -> None:
    top = {f"{a}{b}{c}": MAX_AMOUNT for a in "ab" for b in "abcde" for c in "abcde"}  # 50 currencies
    assert len(top) == MAX_CURRENCIES
    assert ProgramSettings(payout_minimum=top).payout_minimum_for("aaa") == MAX_AMOUNT
    for bad in (
        {**top, "zzz": 1},
        {"usd": MAX_AMOUNT + 1},
        {"usd": -1},
        {"usd": True},
        {"usd": 1.0},
        {"usd": {"usd": 1}},
        {"us": 1},
        {"usd ": 1},
        {"ÜSD": 1},
        {"usd\n": 1},
        {},
        [1],
        "1",
        MAX_AMOUNT + 1,
        -1,
    ):
        with pytest.raises(ValidationError):
            ProgramSettings.model_validate({"commission_flat": bad})
        with pytest.raises(ValueError, match=r"must be|not a currency code|currencies; at most|twice"):
            per_currency(bad)


def test_stored_settings_round_trip_exactly_and_are_repaired_like_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for flat, minimum in ((500, {"jpy": 5000, "usd": 5000}), ({"eur": 450, "usd": 500}, 0)):
        settings = ProgramSettings(commission_type="flat", commission_flat=flat, payout_minimum=minimum)
        stored = settings.model_dump_json()
        again = ProgramSettings.from_stored(stored, "prog_a")
        assert again == settings and (again.commission_flat, again.payout_minimum) == (flat, minimum)
        assert type(again.commission_flat) is type(flat)
    with caplog.at_level(logging.WARNING, logger="tally.ingest"):
        repaired = ProgramSettings.from_stored(
            '{"commission_flat": {"usd": 10000000000000, "jpy": -5}, "payout_minimum": {"us": 1}}', "prog_old"
        )
    assert (repaired.commission_flat, repaired.payout_minimum) == ({"jpy": 0, "usd": MAX_AMOUNT}, 0)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "commission_flat.usd" in logged and "commission_flat.jpy" in logged and "payout_minimum" in logged
