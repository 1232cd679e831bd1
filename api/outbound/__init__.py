"""Webhooks to brand servers, the moving parts (CONTRACT section 13; the tables and the rules
that are the same everywhere are ingest/webhooks_out/):

- derive.py: after each reconcile run, the changes of the published tables become events in
  the outbox (with a delivery for each endpoint that takes them);
- worker.py: the delivery worker inside `tally serve`, off the ingest path: leases due
  deliveries in the database, signs and sends them, records every attempt, schedules retries;
- transport.py: the HTTP transport it sends with, which checks every address a name resolves
  to before it connects (no private, loopback or link-local address) and follows no redirect.
"""
