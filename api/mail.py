"""Mail: a partner's portal sign-in link, sent through the SMTP server of `TALLY_SMTP_URL` from
`TALLY_MAIL_FROM` (stdlib smtplib, blocking: callers run it off the event loop). `smtps://` is
TLS from the start; `smtp://` upgrades with STARTTLS when the server offers it; a login when the
URL names a user. Nothing about the server's password or the link's token is logged."""

from __future__ import annotations

import smtplib
import ssl
from datetime import datetime
from email.message import EmailMessage
from email.utils import formataddr, make_msgid

from api.settings import MailServer

TIMEOUT_SECONDS = 10.0


class MailFailed(Exception):
    """Raised by `send` when the mail server cannot be reached or refuses the message."""


def _one_line(value: str) -> str:
    """`value` fit for a header: every control character (CR and LF above all, which would end
    the header and start another) made a space. Names are refused with them at input (bounds.py);
    this keeps the mail path safe for any stored before that rule."""
    return "".join(" " if ord(c) < 0x20 or ord(c) == 0x7F else c for c in value)


def portal_link_message(
    sender: str, to: str, partner_name: str, program_name: str, url: str, expires_at: datetime
) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = formataddr((_one_line(partner_name), _one_line(to)))
    message["Subject"] = f"Your partner dashboard for {_one_line(program_name)}"
    message["Message-ID"] = make_msgid(domain=sender.rsplit("@", 1)[-1])
    until = expires_at.strftime("%Y-%m-%d %H:%M UTC")
    message.set_content(
        f"Hello {partner_name},\n\n"
        f"{program_name} invites you to your partner dashboard: your referral link, your clicks,\n"
        "sales and commissions, your payouts and where you are paid.\n\n"
        f"Sign in with this link (it works once, until {until}):\n\n{url}\n\n"
        "If you did not expect this email, you can ignore it.\n"
    )
    return message


def send(server: MailServer, message: EmailMessage) -> None:
    """Hand `message` to `server`; MailFailed says why not (never with a password)."""
    context = ssl.create_default_context()
    try:
        client: smtplib.SMTP
        if server.tls:
            client = smtplib.SMTP_SSL(server.host, server.port, timeout=TIMEOUT_SECONDS, context=context)
        else:
            client = smtplib.SMTP(server.host, server.port, timeout=TIMEOUT_SECONDS)
        with client:
            client.ehlo()
            if not server.tls and client.has_extn("starttls"):
                client.starttls(context=context)
                client.ehlo()
            if server.user is not None:
                client.login(server.user, server.password or "")
            client.send_message(message)
    except (OSError, smtplib.SMTPException) as exc:
        reason = type(exc).__name__
        if isinstance(exc, smtplib.SMTPResponseException):
            said = exc.smtp_error
            reason = f"{exc.smtp_code} {said.decode(errors='replace') if isinstance(said, bytes) else said}"
        raise MailFailed(
            f"the mail server {server.host}:{server.port} did not take the message: {reason}"
        ) from None
