"""The routes, a module per audience: track, webhooks, accounts, agent, operator, reports,
backfill, payouts, the dashboard's pages, the API reference, backups and metrics. Each endpoint
is documented by one `Doc` entry beside its route (api/openapi.py).
"""

from starlette.convertors import Convertor, register_url_convertor


class IdConvertor(Convertor[str]):
    """`{name:id}`: one id that may hold `/` (and any other character, newlines included, so
    that an id the ingest refuses still reaches its handler and gets the route's own 404)."""

    regex = "[\\s\\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("id", IdConvertor())
