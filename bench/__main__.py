"""`make bench`: run every benchmark and write bench/out/*.json."""

from __future__ import annotations

import sys

from bench import (
    closes,
    ingest,
    ledger,
    pgingest,
    pgreconcile,
    reconcile,
    report,
    scale,
    slowclients,
    webhook,
    webhooks_out,
)


def main() -> None:
    selected = set(sys.argv[1:])
    benches = {
        "ingest": ingest.main,
        "observability": ingest.observability,
        "pgingest": pgingest.main,
        "webhook": webhook.main,
        "webhooks_out": webhooks_out.main,
        "report": report.main,
        "reconcile": reconcile.main,
        "pgreconcile": pgreconcile.main,
        "ledger": ledger.main,
        "closes": closes.main,
        "slowclients": slowclients.main,
        "scale": scale.main,
    }
    for name, run in benches.items():
        if not selected or name in selected:
            print(f"== bench/{name}", flush=True)
            run()


if __name__ == "__main__":
    main()
