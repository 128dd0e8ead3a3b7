"""The sink's SMTP dialect beyond plain SMTP: STARTTLS, implicit TLS (SMTPS),
AUTH PLAIN and LOGIN with the token rule, and refusals that explain themselves.

- `SIGNALBOX_SMTP_TLS`: STARTTLS offered (`on`), required before MAIL
  (`required`: `530 5.7.0 Must issue a STARTTLS command first`), or `off`.
  A session on the SMTPS port is secure from its first byte.
- `SIGNALBOX_SMTP_AUTH`: `optional` (any credentials pass; a namespace's API
  token as the password makes the mail that namespace's alone), `required`
  (MAIL without AUTH: `530 5.7.0 Authentication required`; only a token
  passes, else `535 5.7.8`, counted like a failed HTTP sign-in: past the
  limit `421` and closed) or `off` (not offered). Credentials are never
  logged nor kept: the session keeps only the namespace.
- A TLS client hello on the plain port is closed with one log line naming
  the SMTPS port and STARTTLS.
- A message declared (`MAIL FROM … SIZE=`) over the size limit is refused at
  each `RCPT TO` (RFC 1870 allows either), so the refusal names its recipient.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword, syntax

from app.domain.ownership import smtp_auth_outcome
from app.domain.refusals import RefusalReason, too_large_detail
from app.settings import Settings, get_settings
from app.usecases.auth import failure_record, principal_for_token

log = logging.getLogger("signalbox.smtp")

STARTTLS_FIRST = "530 5.7.0 Must issue a STARTTLS command first"
AUTH_FIRST = "530 5.7.0 Authentication required"
AUTH_INVALID = "535 5.7.8 Authentication credentials invalid"
AUTH_THROTTLED = "421 4.7.0 Too many failed authentications; try again later"
TOO_BIG_DECLARED = "552 5.3.4 Message size exceeds fixed maximum message size"
_SIZE_PARAM = re.compile(r"\s+SIZE=(\d+)(?=\s|$)", re.IGNORECASE)
# The first bytes of a TLS handshake record (a client hello): 0x16 0x03.
_TLS_RECORD = b"\x16\x03"


def token_namespace(settings: Settings, password: str) -> str | None:
    """The namespace whose API token `password` is (None: it is none, or an
    operator's). May ask the database: run it off the event loop."""
    principal = principal_for_token(settings, password) if password.strip() else None
    return principal.namespace if principal is not None else None


class SinkSMTP(SMTP):
    """aiosmtpd's SMTP with the sink's TLS, AUTH and refusal rules. The plain
    listener's sessions get `tls_context` (STARTTLS, unless off); the SMTPS
    listener's get `implicit_tls=True` and none."""

    def __init__(
        self,
        handler: Any,
        *,
        settings: Settings | None = None,
        implicit_tls: bool = False,
        **kwargs: Any,
    ) -> None:
        # The sink applies STARTTLS and AUTH requirements itself (its own
        # replies, each refusal noted); aiosmtpd only offers them.
        super().__init__(
            handler, require_starttls=False, auth_required=False, auth_require_tls=False, **kwargs
        )
        self.settings = settings or get_settings()
        self._implicit_tls = implicit_tls
        self._heard = False
        self._rcpt_arg: str | None = None
        self._hide_auth = False

    @property
    def secure(self) -> bool:
        return self._implicit_tls or self._tls_protocol is not None

    def _auth_namespace(self) -> str | None:
        return getattr(self.session, "auth_namespace", None)

    def _note(
        self,
        reply: str,
        reason: RefusalReason,
        recipients: list[str] | None = None,
        detail: str | None = None,
    ) -> None:
        self.event_handler.refusals.note(
            reply, reason, recipients or [], self._auth_namespace(), detail
        )

    # ------------------------------------------------------------ wrong dialect

    def data_received(self, data: bytes) -> None:
        if not self._heard:
            self._heard = True
            if not self.secure and data.startswith(_TLS_RECORD):
                self._tls_hello_on_plain_port()
                return
        super().data_received(data)

    def _tls_hello_on_plain_port(self) -> None:
        smtps = self.settings.smtps_port
        where = f"use the SMTPS port {smtps}" if smtps else "turn on SIGNALBOX_SMTPS_PORT"
        log.warning(
            "a client began TLS on the plain SMTP port %s: it expects implicit TLS (SMTPS);"
            " %s for it, or have it send STARTTLS on this port (EMAIL_USE_TLS, not"
            " EMAIL_USE_SSL); connection closed",
            self.settings.smtp_port,
            where,
            extra={"event": "smtp_tls_on_plain_port"},
        )
        self.event_handler.refusals.note("", RefusalReason.TLS_ON_PLAIN_PORT)
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------ requirements

    async def check_auth_needed(self, caller_method: str) -> bool:
        """MAIL, RCPT and DATA: STARTTLS first when required, then AUTH when
        required; each refusal noted (RCPT with its recipient)."""
        refusal: tuple[str, RefusalReason] | None = None
        if self.settings.smtp_tls == "required" and not self.secure:
            refusal = (STARTTLS_FIRST, RefusalReason.STARTTLS_REQUIRED)
        elif self.settings.smtp_auth == "required" and not (
            self.session is not None and self.session.authenticated
        ):
            refusal = (AUTH_FIRST, RefusalReason.AUTH_REQUIRED)
        if refusal is None:
            return False
        reply, reason = refusal
        if caller_method == "MAIL":
            self._note(reply, reason)
        elif caller_method == "RCPT":
            address = self._rcpt_address()
            self._note(reply, reason, [address] if address else [])
        await self.push(reply)
        return True

    def _rcpt_address(self) -> str | None:
        arg = self._strip_command_keyword("TO:", self._rcpt_arg or "")
        if not arg:
            return None
        address, _ = self._getaddr(arg)
        return address or None

    @syntax("MAIL FROM: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_MAIL(self, arg: str | None) -> None:
        """aiosmtpd's MAIL, except that a declared SIZE over the limit is
        refused at each RCPT TO (naming its recipient), not here."""
        declared = None
        limit = self.data_size_limit
        if arg and limit:
            found = _SIZE_PARAM.search(arg)
            if found and int(found.group(1)) > limit:
                declared = int(found.group(1))
                arg = arg[: found.start()] + arg[found.end() :]
        await super().smtp_MAIL(arg)
        if declared is not None and self.envelope is not None and self.envelope.mail_from:
            self.envelope.declared_size = declared  # type: ignore[attr-defined]

    @syntax("RCPT TO: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_RCPT(self, arg: str | None) -> None:
        self._rcpt_arg = arg
        try:
            declared = getattr(self.envelope, "declared_size", None)
            if declared is None:
                await super().smtp_RCPT(arg)
            elif not await self.check_auth_needed("RCPT"):
                address = self._rcpt_address()
                detail = too_large_detail(declared, self.data_size_limit or 0)
                self._note(
                    TOO_BIG_DECLARED,
                    RefusalReason.MESSAGE_TOO_LARGE,
                    [address] if address else [],
                    detail,
                )
                await self.push(f"{TOO_BIG_DECLARED} ({detail})")
        finally:
            self._rcpt_arg = None

    @syntax("EHLO hostname")
    async def smtp_EHLO(self, hostname: str) -> None:
        """aiosmtpd's EHLO, without the AUTH line when AUTH is off."""
        self._hide_auth = self.settings.smtp_auth == "off"
        try:
            await super().smtp_EHLO(hostname)
        finally:
            self._hide_auth = False

    async def push(self, status: Any) -> None:
        if self._hide_auth and isinstance(status, str) and status.startswith("250-AUTH"):
            return
        await super().push(status)

    # ------------------------------------------------------------ AUTH

    @syntax("AUTH <mechanism>")
    async def smtp_AUTH(self, arg: str) -> None:
        if self.settings.smtp_auth == "off":
            await self.push("502 5.5.1 AUTH is not offered here (SIGNALBOX_SMTP_AUTH=off)")
            return
        if self.settings.smtp_tls == "required" and not self.secure:
            await self.push(STARTTLS_FIRST)
            return
        await super().smtp_AUTH(arg)

    def _authenticate(self, mechanism: str, auth_data: Any) -> AuthResult:
        # Decided by `_decide` (it may ask the database): the credentials are
        # handed over once, never kept on the session.
        return AuthResult(success=False, handled=False, auth_data=auth_data)

    async def auth_PLAIN(self, _: Any, args: list[str]) -> AuthResult:
        return await self._decide(await super().auth_PLAIN(_, args))

    async def auth_LOGIN(self, _: Any, args: list[str]) -> AuthResult:
        return await self._decide(await super().auth_LOGIN(_, args))

    async def _decide(self, result: AuthResult) -> AuthResult:
        credentials = result.auth_data
        if result.handled or not isinstance(credentials, LoginPassword):
            return AuthResult(success=False, handled=result.handled)
        password = credentials.password.decode("utf-8", "replace")
        del credentials, result
        loop = asyncio.get_running_loop()
        namespace = await loop.run_in_executor(None, token_namespace, self.settings, password)
        del password
        outcome = smtp_auth_outcome(self.settings.smtp_auth, namespace)
        assert self.session is not None
        if outcome.accepted:
            self.session.auth_namespace = outcome.namespace  # type: ignore[attr-defined]
            log.info(
                "SMTP client authenticated",
                extra={"event": "smtp_authenticated", "namespace": outcome.namespace},
            )
            return AuthResult(success=True, handled=False)
        address = str(self.session.peer[0]) if isinstance(self.session.peer, tuple) else ""
        wait = await loop.run_in_executor(None, failure_record, self.settings, address)
        self._note(AUTH_INVALID, RefusalReason.AUTH_FAILED)
        if wait is not None:
            await self.push(AUTH_THROTTLED)
            if self.transport is not None:
                self.transport.close()
            return AuthResult(success=False, handled=True)
        return AuthResult(success=False, handled=False, message=AUTH_INVALID)
