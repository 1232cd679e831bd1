"""The html finance report: a body fragment (the dashboard embeds it) and a standalone page.

The page needs nothing from the network: styles are in one `<style>` element (allowed by the
hash in `DOCUMENT_CSP`), charts are inline SVG (reports/charts.py), and there is no script.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from reports import charts
from reports.finance import FinanceReport
from reports.labels import (
    COLUMN_LABELS,
    COUNT_CHECKS,
    SUMMARY_LABELS,
    check_label,
    is_money,
    label_html,
    when_html,
)
from reports.money import money_text

TEMPLATES = Path(__file__).parent / "templates"
# The report's own rules (scoped to .finance-report; the dashboard serves them beside its styles)
# and, for the standalone page, the page's.
REPORT_CSS = (TEMPLATES / "report.css").read_text()
STYLESHEET = (TEMPLATES / "page.css").read_text() + REPORT_CSS
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLESHEET.encode()).digest()).decode()
# What a browser may load for the standalone page: its own stylesheet element, nothing else.
DOCUMENT_CSP = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'none'; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)


@cache
def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals.update(
        money=money_text,
        column_label=COLUMN_LABELS.get,
        summary_labels=SUMMARY_LABELS,
        check_label=check_label,
        count_checks=COUNT_CHECKS,
        is_money=is_money,
        label=label_html,
        when=when_html,
    )
    return env


def _mine(frame: pl.DataFrame, currency: str) -> list[dict[str, Any]]:
    return frame.filter(pl.col("currency") == currency).to_dicts()


def _svg(svg: str) -> Markup:
    return Markup(svg)  # noqa: S704 - our own chart, made inline-safe by charts.inline_svg


def currency_views(report: FinanceReport, draw: bool = True) -> list[dict[str, Any]]:
    """Per currency: its summary, sections and charts, as the template shows them."""
    views = []
    for summary in report.summary.iter_rows(named=True):
        code = summary["currency"]
        partners = _mine(report.by_partner, code)
        statuses = _mine(report.by_status, code)
        views.append(
            {
                "code": code,
                "summary": summary,
                "by_status": statuses,
                "by_partner": partners,
                "adjustments": _mine(report.adjustments, code),
                "clawbacks": _mine(report.clawbacks, code),
                "unattributed": _mine(report.unattributed, code),
                "double_counts": _mine(report.double_counts, code),
                "checks": _mine(report.checks, code),
                "partners_chart": _svg(charts.partners_chart(partners, code)) if partners and draw else None,
                "status_chart": _svg(charts.status_chart(statuses, code)) if statuses and draw else None,
            }
        )
    return views


def finance_body(report: FinanceReport) -> Markup:
    """The report as an html fragment (`<article id="finance-report">`)."""
    html = (
        _environment()
        .get_template("finance_body.html")
        .render(report=report, currencies=currency_views(report))
    )
    return Markup(html)  # noqa: S704 - rendered by an autoescaping template


def finance_document(report: FinanceReport) -> str:
    """The report as a standalone html page."""
    return (
        _environment()
        .get_template("finance.html")
        .render(
            report=report,
            body=finance_body(report),
            stylesheet=Markup(STYLESHEET),  # noqa: S704 - our file
        )
    )
