"""What ingest knows without any I/O: the records it stores and reads (records.py), the errors it
raises (errors.py), the strict request models and their bounds (inputs.py, bounds.py), the one
clock (clock.py), credentials' tokens and hashes (tokens.py), the processor's event types
(events.py), and the key rules both backends apply (keys.py).
"""
