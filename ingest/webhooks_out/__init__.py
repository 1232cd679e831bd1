"""Webhooks to brand servers (CONTRACT section 13): what is the same on every backend and needs
no reconciler, no HTTP client and no clock of its own.

- events.py: the event types, their stable ids and the body a delivery sends;
- signing.py: Standard Webhooks signatures (`webhook-id`, `webhook-timestamp`,
  `webhook-signature`) and the `whsec_` secrets they are made with;
- schedule.py: when a failed delivery is tried again, when it has failed, when an endpoint is
  disabled;
- addresses.py: which URLs and which addresses a delivery may reach (the SSRF rule);
- inputs.py: the endpoint requests' models;
- outbox.py: the tables (endpoints, events, deliveries and their attempts, the marks events are
  derived against) and every statement on them, in the SQL both backends speak.

The events are derived from the reconciler's published tables by api/outbound/derive.py and sent
by api/outbound/worker.py.
"""
