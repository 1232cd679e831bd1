"""The SDK's version: the one place it is written (the wheel's metadata and `User-Agent` read it)."""

__version__ = "0.4.0"
