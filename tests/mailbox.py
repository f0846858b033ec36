"""A real SMTP server for tests: aiosmtpd on 127.0.0.1, the Airflow connection that
reaches it, and the messages it received. Stopped by :meth:`Mailbox.stop` (or at the
end of a ``with`` block)."""

from __future__ import annotations

import email
import json
import socket
from email import policy
from typing import Any

#: Who the messages come from and go to.
SENDER = "embedfresh@example.com"
RECIPIENTS = ("ml-platform@example.com", "search-oncall@example.com")


def free_port() -> int:
    # aiosmtpd's Controller cannot start on port 0 (it connects to its own port to check).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mailbox:
    """An SMTP server that keeps every message it is given."""

    def __init__(self) -> None:
        self.envelopes: list[Any] = []
        self.port = free_port()
        self._controller: Any = None

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 (aiosmtpd's name)
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"

    def start(self) -> Mailbox:
        from aiosmtpd.controller import Controller

        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> Mailbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def messages(self) -> list[email.message.EmailMessage]:
        return [email.message_from_bytes(e.content, policy=policy.default) for e in self.envelopes]

    def connection(self) -> str:
        """The Airflow connection (``AIRFLOW_CONN_<ID>``'s JSON) of this server."""
        extra = {
            "from_email": SENDER,
            "disable_ssl": True,
            "disable_tls": True,
            "timeout": 10,
            "retry_limit": 0,
        }
        return json.dumps(
            {"conn_type": "smtp", "host": "127.0.0.1", "port": self.port, "extra": extra}
        )

    def env(self, conn_id: str = "notify_smtp") -> dict[str, str]:
        """The environment that turns embedfresh's e-mail on, to this server."""
        return {
            f"AIRFLOW_CONN_{conn_id.upper()}": self.connection(),
            "EMBEDFRESH_NOTIFY_EMAIL": ", ".join(RECIPIENTS),
            "EMBEDFRESH_NOTIFY_SMTP_CONN_ID": conn_id,
        }
