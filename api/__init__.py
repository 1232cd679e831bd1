"""The web side: the Starlette app (api/app.py), its routes by audience (api/routes/), the
credential checks, the one error map, the dashboard's pages and templates, the reconcile schedule
(api/jobs.py), observability, and the `tally` command line (api/cli*.py).

Routes parse, call one function of ingest/ or reports/, and answer; nothing under reconcile/,
reports/ or ingest/ imports api/.
"""
