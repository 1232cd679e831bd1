"""`tally serve`: run the server (settings from TALLY_* environment variables)."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import click

from api.cli.errors import CliError
from api.cli.options import examples


@click.command(
    short_help="run the server",
    epilog=examples("TALLY_OPERATOR_TOKEN=... tally serve --host 0.0.0.0 --port 8000"),
)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=8000, show_default=True, help="port to listen on")
@click.option(
    "--database", metavar="PATH|URL", help="DuckDB file or postgresql:// URL (default: TALLY_DATABASE)"
)
def serve(host: str, port: int, database: str | None) -> None:
    """Run the tally server (settings from TALLY_* environment variables)."""
    # The app loads Polars and the reconciler (seconds): only the command that serves loads it,
    # and only after main() has tuned Polars' allocator (reconcile/allocator.py).
    from api import observability, serving
    from api.app import create_app
    from api.settings import SettingsError, load_settings

    overrides: dict[str, Any] = {"database": database} if database else {}
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        raise CliError(f"refusing to start: {exc}") from None
    # The writer thread wakes from fsync many times a second; with the default 5 ms GIL switch
    # interval every wake-up would wait behind the event loop. 0.5 ms keeps commits prompt.
    sys.setswitchinterval(float(os.environ.get("TALLY_SWITCH", "0.0005")))
    # Requests allocate many short-lived objects; collecting the young generation every 700
    # allocations (the default) and the old one often costs more than the requests themselves.
    gc.set_threshold(50_000, 50, 1_000)
    listening = f"tally: listening on http://{host}:{port} (database {settings.database_name})"
    # TALLY_LOG_FORMAT, TALLY_LOG_LEVEL (stderr); held back until started: a failed start is one line
    observability.configure_logging(settings, hold=True)
    try:
        serving.run(
            create_app(settings),
            host,
            port,
            settings.header_timeout_seconds,
            listening,
            on_started=observability.release_logging,
        )
    except serving.StartupFailed as exc:
        observability.stop_logging(discard=True)
        raise CliError(f"cannot start: {exc}") from None
    finally:
        observability.stop_logging()
