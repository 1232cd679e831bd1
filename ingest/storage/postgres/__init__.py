"""The PostgreSQL backend: several replicas sharing one database (store.py); the group commit
(tx.py), what ingest decides from (keys.py), connections and faults (conn.py), control-plane rows
(control.py), the reads (reader.py), the log source and result sink for the reconciler (source.py,
sink.py), and the reconciler's working copy on this machine (copy.py).
"""
