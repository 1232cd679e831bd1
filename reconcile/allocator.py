"""Polars' allocator settings for processes that reconcile (the `tally` command, the bench).

Polars allocates with jemalloc and, by default, hands freed memory back to the system after
0.5 s (dirty pages; 1 s muzzy), set by polars/__init__.py and extended by `_RJEM_MALLOC_CONF`
when that is set before Polars is first imported. A reconcile run frees and refills gigabytes
between its steps; handing them back that fast makes every step fault them in anew (and flush
other cores' TLBs on the way). Keeping them 10 s made a 10M-event full run about 6 % faster in
three paired runs of bench/reconcile (35.4 s -> 33.4 s mean; 5.7M -> 3.5M page faults), for
0.4 GiB more peak RSS (4.8 -> 5.2 GiB); an idle server still returns the memory 10 s after a run.
"""

from __future__ import annotations

import os
import sys

POLARS_JEMALLOC = "dirty_decay_ms:10000,muzzy_decay_ms:10000"


def tune() -> bool:
    """Set Polars' allocator decay for this process, unless Polars is already imported (too
    late) or the environment already says otherwise; whether the setting is in effect."""
    if "polars" in sys.modules:
        return os.environ.get("_RJEM_MALLOC_CONF") == POLARS_JEMALLOC
    os.environ.setdefault("_RJEM_MALLOC_CONF", POLARS_JEMALLOC)
    return os.environ["_RJEM_MALLOC_CONF"] == POLARS_JEMALLOC
