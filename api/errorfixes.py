"""How to fix each error and warning code: what `/docs/errors` shows under each code, after what
raises it (the error class's docstring). Every code of `ingest.errors.ALL_ERRORS` and every
warning code has an entry (tests/api/test_error_page.py)."""

from __future__ import annotations

ERROR_FIXES: dict[str, str] = {
    "invalid_json": "Send a JSON object as the body, with `Content-Type: application/json`: `{}` rather "
    "than nothing, an array or form data. When you build the body in a shell, check its quoting.",
    "invalid_signature": "Pass the processor's raw body on unchanged (not re-serialised JSON), and put "
    "every signing secret (`whsec_...`) the processor may sign with in `TALLY_STRIPE_WEBHOOK_SECRETS` "
    "(comma-separated, so secrets can be rolled). Keep the server's clock in sync: deliveries signed "
    "longer ago than `TALLY_STRIPE_TOLERANCE_SECONDS` (default 300) are refused.",
    "missing_credentials": "Send `Authorization: Bearer <credential>`: the program key (`aff_...`) for "
    "track sale, refund and server-mode lead calls, an account token (`acct_...`) for account "
    "endpoints, an agent key (`agt_...`) for agent endpoints, the operator token for operator ones.",
    "malformed_authorization": "Send exactly `Authorization: Bearer <credential>`: the word Bearer, one "
    "space, then the whole value, without quotes or anything after it.",
    "invalid_api_key": "Use the program's current key. A regenerated key replaces the old one at once: "
    "put the new key in your server's environment (`SERVICE_API_KEY`). A lost key cannot be recovered: "
    "a workspace owner regenerates it (dashboard: the program's settings, API key; or "
    "`tally keys regenerate --program prog_...`).",
    "api_key_rotation_required": "A workspace owner regenerates the key (dashboard: the program's "
    "settings, Regenerate API key; or `tally keys regenerate --program prog_...`) and deploys the new "
    "one; regenerating clears the rotation flag.",
    "program_key_required": "Track sale, refund and server-mode lead calls take the program's API key "
    "(`aff_...`), never an account token, agent key or operator token.",
    "agent_key_required": "Agent endpoints (`/api/agent/v1/...`) take an agent key (`agt_...`) issued by "
    "the operator; a program key or an account token is never accepted there.",
    "account_token_required": "Account endpoints (programs, partners, reads, reports, payouts) take an "
    "account token (`acct_...`): the one shown when your account was created (`tally login` keeps it "
    "for the CLI).",
    "operator_token_required": "Operator endpoints take the value of the server's "
    "`TALLY_OPERATOR_TOKEN` (`make run` keeps it in `data/operator-token`).",
    "owner_required": "Ask an owner of the workspace to do it, or to make you an owner "
    '(`POST /api/v1/workspaces/{workspace_id}/members` with `"role": "owner"`).',
    "insufficient_scope": "Ask the operator for an agent key with the scope the message names "
    "(`programs:read` or `programs:write`).",
    "program_not_found": "Check the program id (`prog_...`: the dashboard's Programs page or "
    "`tally programs list`) and that your credential belongs to the program's workspace: a program of "
    "another workspace is reported as not found.",
    "partner_not_found": "Use the code of a partner of this program (the dashboard's Partners section or "
    "`GET /api/v1/programs/{id}/partners`; codes are case-sensitive), or add the partner first.",
    "sale_not_found": "Check the transaction id: a connect sale is known by its invoice id, else its "
    "payment intent id, else its checkout session id. A sale recorded a moment ago is in the log but not "
    "reconciled yet (the error then says so, with a `hint`): wait for the next reconcile run (every "
    "`TALLY_RECONCILE_INTERVAL_SECONDS`) or start one with `tally reconcile`.",
    "not_found": "Check the path and the ids in it against the API reference (`/docs`).",
    "method_not_allowed": "Use a method the path supports; the API reference (`/docs`) lists them.",
    "duplicate_transaction": "Nothing to do when you were retrying: the sale is recorded once. Another "
    "sale needs its own `transaction_id` (`invoiceId`). With the connect webhook active, do not also "
    "send the same sale with a track call.",
    "duplicate_refund": "Nothing to do when you were retrying: the refund is recorded once. Another "
    "refund of the same sale needs its own `refund_id`.",
    "conflict": "Choose another value (for a partner, another code) or use the one that exists.",
    "line_paid": "A paid line never changes. Refund the sale instead: the refund becomes a clawback line "
    "that the partner's next payout batch nets.",
    "line_in_batch": "An open payout batch holds a line of this sale: cancel that batch first "
    "(`POST /api/v1/programs/{id}/payouts/{payout_id}/cancel`, or the Payouts tab), then hold or void "
    "the sale; a later batch pays what is still due.",
    "batch_paid": "A paid batch cannot be cancelled: its money was sent. When one partner's payment "
    "bounced, mark that row failed (`POST .../payouts/{payout_id}/rows/{partner_code}/{currency}/failed`): "
    "its lines are owed again and the next batch pays them.",
    "currency_not_supported": "Ask for a currency the service pays (the message names the one refused), "
    "or pay that partner another way: the batch lists them under `not_paid` with this reason.",
    "invalid_transition": "Look at the sale's lines on its explain page: pending and approved lines can be "
    "held or voided, only held lines can be released, and void lines take no action.",
    "stripe_account_in_use": "A processor account belongs to one workspace: use the account connected "
    "for this workspace, or take it off the other workspace's program first.",
    "request_timeout": "Send the whole body promptly and retry (a proxy that stalls uploads causes this).",
    "payload_too_large": "Keep the body under 1 MiB: move large `additional_data` elsewhere, or split the "
    "request.",
    "validation_error": "Correct each field `error.fields` lists (its `field` and `message`). Amounts are "
    "positive integers in minor units (cents), times RFC 3339 with an offset, and unknown fields are "
    "refused.",
    "program_mismatch": "Leave `program_id` out of server-mode calls (the key names the program), or use "
    "the key of the program you name.",
    "refund_exceeds_sale": "Refund at most what is left of the sale (its amount less earlier refunds, in "
    "minor units); the sale's explain view shows what was refunded so far.",
    "rate_limited": "Wait the seconds `Retry-After` gives, then retry; spread bursts out.",
    "reconcile_running": "Retry after the seconds `Retry-After` gives: a reconcile run holds the lock, "
    "and nothing of your call was done.",
    "service_unavailable": "The server is starting or stopping: retry in a moment (`/readyz` answers 200 "
    "once it takes writes).",
    "database_unavailable": "Nothing was recorded: retry after the seconds `Retry-After` gives. "
    "Operators: check the disk's free space and the database connection; `/readyz` answers 200 "
    "again once writes succeed.",
    "internal_error": "Retry; if it persists, give the operator the response's `X-Request-Id`: the "
    "server's log has the error under it.",
}

WARNING_FIXES: dict[str, str] = {
    "api_key_rotation_required": "Regenerate the key before the deadline (dashboard: the program's "
    "settings, Regenerate API key; or `tally keys regenerate --program prog_...`) and deploy the new one.",
    "customer_not_attributed": "Report the signup with the same customer id before the sale: "
    "`tally.signup(userId)` in the browser after the `?aff=` click, or a server-mode lead with the "
    "`click_id`. The sale is kept either way, and the next reconcile run attributes it once the lead "
    "or click is there.",
    "sale_not_found": "Nothing to do when the sale is on its way (a processor webhook may come later): "
    "the refund is matched once its sale arrives. Otherwise check that `transaction_id` is the sale's.",
}
