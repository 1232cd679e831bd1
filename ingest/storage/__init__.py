"""Storage: the contract every backend keeps (contract.py: `Store`, `Tx`, `Reader`, the log source
and result sink, the backup types), what both share (schema.py, migrations.py, sql.py, private
files and lock files), and the one factory that picks a backend from `TALLY_DATABASE`
(factory.py). Each backend is a folder of its own with the same file names where it can:
storage/duckdb/ (one process, one file) and storage/postgres/ (several replicas).
"""
