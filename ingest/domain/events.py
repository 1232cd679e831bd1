"""The processor's event types tally reads: the one list ingest (ingest/stripe.py, the key rules
of ingest/domain/keys.py) and the reconciler (reconcile/normalise.py, reconcile/refunds.py) share.
"""

from __future__ import annotations

# A paid checkout session: a one-time sale, or a subscription's first payment.
CHECKOUT_EVENTS = frozenset({"checkout.session.completed", "checkout.session.async_payment_succeeded"})
# A paid invoice (a subscription's renewals); one invoice may arrive as both.
INVOICE_EVENTS = frozenset({"invoice.payment_succeeded", "invoice.paid"})
# What a live processor sale arrives as.
SALE_EVENTS = CHECKOUT_EVENTS | INVOICE_EVENTS
# A charge's refunds, cumulative (`amount_refunded`).
REFUND_EVENTS = frozenset({"charge.refunded"})
SUBSCRIPTION_EVENTS = frozenset({"customer.subscription.created", "customer.subscription.updated"})
# An `InvoicePayment` (API 2025-03-31+): links an invoice to the payment intent (or charge) that
# paid it, since such an invoice names neither (reconcile/refunds.py `links`).
LINK_EVENTS = frozenset({"invoice_payment.paid"})
# The event types the contract names (section 5): the only ones a refused delivery's note names.
KNOWN_EVENTS = SALE_EVENTS | REFUND_EVENTS | SUBSCRIPTION_EVENTS | LINK_EVENTS
