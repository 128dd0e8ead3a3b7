"""Run the SMTP sink (aiosmtpd) on SIGNALBOX_SMTP_HOST:SIGNALBOX_SMTP_PORT."""

from __future__ import annotations

from aiosmtpd.controller import Controller

from app.settings import Settings
from app.smtp.handler import SinkHandler


def make_controller(settings: Settings) -> Controller:
    return Controller(
        SinkHandler(settings),
        hostname=settings.smtp_host,
        port=settings.smtp_port,
        data_size_limit=settings.smtp_max_bytes,
        # Mail bytes exactly as sent: parsing is ours and never crashes.
        decode_data=False,
        server_kwargs={"ident": "Signalbox sink"},
    )
