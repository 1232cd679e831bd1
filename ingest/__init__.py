"""Ingest: the services that take calls and append them to the raw event log.

- ingest/: the services: tracking (track calls), deliveries (processor webhooks), control (the
  control plane: accounts, workspaces, programs, partners, keys), actions (engineer and finance
  actions as log rows), the single group-commit writer (writer.py), stripe parsing, refusal notes,
  progress reporting;
- ingest/domain/: records, errors, inputs, bounds, clock, tokens, the processor's event types,
  and the key rules (keys.py: what a row claims and changes in the tables ingest decides from);
  pure, no I/O;
- ingest/storage/: the storage contract both backends keep (contract.py), the schema and its
  migrations, the SQL both databases speak, the one factory (factory.py); the embedded backend in
  storage/duckdb/, PostgreSQL's in storage/postgres/.

Nothing here imports reconcile/, reports/ or api/.
"""
