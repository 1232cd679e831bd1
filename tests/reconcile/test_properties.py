"""Random event streams: the real reconciler agrees with the reference, whatever the order."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from reconcile.pipeline import reconcile
from tests.reconcile import builders as b
from tests.reconcile.compare import assert_results_equal, checked
from tests.reconcile.streams import ENGINEER, Stream, between_fixed, profile, streams

PROFILE = profile(25, ci=200)


@PROFILE
@given(stream=streams())
def test_real_reconciler_agrees_with_the_reference(stream: Stream) -> None:
    checked(stream.frame(), stream.programs, stream.partners, stream.now)


def _rearrived(rows: list[dict[str, Any]], order: list[int]) -> list[dict[str, Any]]:
    """The same events arriving in `order`; engineer actions keep their own relative order
    (for them the order of arrival is the truth), and no data row crosses one whose log position
    the books show (a batch, its payment, a booking, an act: streams.py `between_fixed`);
    everything else may move freely."""
    shuffled = between_fixed(rows, order)  # nothing crosses a booking, a batch or an act
    engineer = iter([r for r in rows if r["kind"] in ENGINEER])
    return [next(engineer) if r["kind"] in ENGINEER else r for r in shuffled]


@PROFILE
@given(stream=streams(closes=False), data=st.data())
def test_any_arrival_order_gives_identical_output(stream: Stream, data: st.DataObject) -> None:
    order = data.draw(st.permutations(range(len(stream.rows))))
    rearrived = b.frame(_rearrived(stream.rows, order))
    first = reconcile(stream.frame(), stream.programs, stream.partners, stream.now)
    second = reconcile(rearrived, stream.programs, stream.partners, stream.now)
    assert_results_equal(first, second)


@profile(5, ci=40)
@given(stream=streams())
def test_running_twice_gives_identical_output(stream: Stream) -> None:
    """The same inputs twice give the same output, and a run leaves its inputs as they were
    (nothing is kept from one run to the next, nothing written back)."""
    raw, programs, partners = stream.frame(), stream.programs, stream.partners
    kept = (raw.clone(), programs.clone(), partners.clone())
    first = reconcile(raw, programs, partners, stream.now)
    for given_frame, as_given in zip((raw, programs, partners), kept, strict=True):
        assert_frame_equal(given_frame, as_given)
    second = reconcile(raw, programs, partners, stream.now)
    assert_results_equal(first, second)


@profile(5, ci=40)
@given(stream=streams())
def test_a_lazy_log_gives_the_output_of_an_eager_one(stream: Stream) -> None:
    raw = stream.frame()
    eager = reconcile(raw, stream.programs, stream.partners, stream.now)
    lazy = reconcile(raw.lazy(), stream.programs, stream.partners, stream.now)
    assert_results_equal(eager, lazy)
