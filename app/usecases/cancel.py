"""Use case: a producer cancels a signal its test no longer waits for.

`waiting`, `found` or `claimed` → `cancelled` (final): an active claim ends,
no dead letter is written, the long poll answers. Cancelling a cancelled
signal answers it again; any other status is a 409 `not_cancellable`.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.exc import OperationalError

from app.db import cancels as cancels_db
from app.db import signals as signals_db
from app.db.engine import retryable, transaction
from app.domain.states import Status
from app.errors import Conflict, NotFound
from app.observability.logs import signal_extra
from app.usecases import views
from app.usecases.inputs import Cancel

log = logging.getLogger("signalbox.signals")

# A cancel that met a consume or a lapse at the same instant is tried again.
_ATTEMPTS = 3


def signal_cancel(namespace: str, signal_id: str, req: Cancel) -> dict[str, Any]:
    """The cancelled signal's view."""
    for attempt in range(_ATTEMPTS):
        try:
            return _cancel_once(namespace, signal_id, req)
        except OperationalError as exc:
            if not retryable(exc) or attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _cancel_once(namespace: str, signal_id: str, req: Cancel) -> dict[str, Any]:
    with transaction() as session:
        # The claim first, then the signal: the order a consume locks them in.
        cancels_db.claim_lock_active_for_signal(session, signal_id)
        row = cancels_db.signal_cancel(session, signal_id, namespace, req.reason)
        if row is not None:
            ended = cancels_db.claim_end_cancelled(session, signal_id)
        else:
            current = signals_db.signal_get(session, signal_id, namespace)
            if current is None:
                raise NotFound(f"no signal {signal_id}")
            if current["status"] != Status.CANCELLED:
                raise Conflict(
                    f"signal {signal_id} is {current['status']}: only a waiting, found or"
                    " claimed signal can be cancelled",
                    code="not_cancellable",
                )
        view_row = signals_db.signal_view_get(session, signal_id, namespace)
        assert view_row is not None
        view = views.signal_views(session, [view_row])[0]
    if row is not None:
        log.info(
            "signal cancelled",
            extra=signal_extra(
                "signal_cancelled", row["run_id"], signal_id, row["recipient"], claims_ended=ended
            ),
        )
    return view
