"""The routes, a module per audience: track, webhooks, accounts, agent, operator, reports,
backfill, payouts, the dashboard's pages, the API reference, backups and metrics. Each endpoint
is documented by one `Doc` entry beside its route (api/openapi.py).
"""
