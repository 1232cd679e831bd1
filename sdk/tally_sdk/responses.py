"""The `data` of each track call's success envelope, and the envelope's `warnings`, as typed dicts.

`TrackResult.data` is one of these, read as the server sent it (JSON object, keys as documented
in the contract's section 4): `track_sale` -> `SaleData`, `track_test_sale` -> `SaleTestModeData`,
`track_lead` -> `LeadData`, `track_refund` -> `RefundData`. They are `TypedDict`s, so a newer
server may add keys without breaking a brand server; the keys listed here are always present.
"""

# No `from __future__ import annotations` here: `NotRequired` must be seen when the class is made,
# or Python 3.11 counts the key as required (`ApiWarning.__required_keys__`).
from typing import Literal, NotRequired, TypedDict


class SaleData(TypedDict):
    """A recorded real sale (`POST /api/v1/track/sale`)."""

    sale_id: str
    transaction_id: str
    test_mode: bool  # always False here
    attributed: bool  # False: no settled lead or click yet (warning `customer_not_attributed`)
    partner_code: str | None
    customer_external_id: str
    amount: int  # minor units
    currency: str


class SaleTestModeData(TypedDict):
    """The test-mode sale (`additional_data.test_mode`): stored, never commissioned."""

    sale_id: str
    transaction_id: str | None
    test_mode: bool  # always True here


class LeadData(TypedDict):
    """A server-mode lead (`POST /api/v1/track/lead` with the program key)."""

    lead_id: str
    customer_external_id: str
    status: Literal["settled", "provisional"]
    provisional: bool


class RefundData(TypedDict):
    """A recorded refund (`POST /api/v1/track/refund`)."""

    refund_id: str
    transaction_id: str
    amount: int  # minor units
    sale_found: bool  # False: the sale is not known yet (warning `sale_not_found`); kept anyway


class ApiWarning(TypedDict):
    """One entry of the envelope's `warnings` (`customer_not_attributed`, `sale_not_found`,
    `api_key_rotation_required` with its `deadline`...)."""

    code: str
    message: NotRequired[str]
    deadline: NotRequired[str]  # RFC 3339, on `api_key_rotation_required`
