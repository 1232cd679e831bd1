"""The embedded backend: one DuckDB file owned by one process (store.py says how it opens and
which module holds what: tx, copier and journal, keys, control, reader, sessions, backup, faults).
"""
