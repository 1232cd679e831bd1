"""The Jinja2 environment for server-rendered pages (autoescaped).

`| segment` is how any id or name reaches a URL: percent-encoded with nothing kept (`/`, `?`,
`#`, `%` and the rest all escaped), so a planted id such as `x/../../payouts/<id>/paid` stays one
path segment and can never steer a form's action to another page (issue 48). Jinja's own
`urlencode` keeps `/`, so it is never used for ids.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape


def segment(value: object) -> str:
    """`value` as one URL path segment (or query value): every reserved character escaped."""
    return quote(str(value), safe="")


templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["segment"] = segment
