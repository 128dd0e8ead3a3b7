"""``Watch``: what the pytest plugin's ``signalbox_watch`` fixture is (a
:meth:`Signalbox.watch` with the session's run id and the test's case bound)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from signalbox.client import Signalbox, SignalHandle
from signalbox.errors import hide_client_frames

# pytest: a Signalbox error's traceback leaves this module's frames out.
__tracebackhide__ = hide_client_frames


class Watch:
    """``signalbox_watch(recipient, ...)``: :meth:`Signalbox.watch` with run and test bound.

    The first call in a test uses the server's default idempotency key
    (``run_id:test_case``); later calls get ``run_id:test_case#N`` so a test can
    expect several emails. A rerun of a failed test in the same session
    (pytest-rerunfailures' ``execution_count`` > 1) gets keys of its own
    (``…@rerunN``): the failed attempt's signals were cancelled.
    """

    def __init__(
        self,
        client: Signalbox,
        run_id: str,
        test_case: str,
        defaults: Mapping[str, Any],
        attempt: int = 1,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.test_case = test_case
        self.defaults = dict(defaults)
        self.calls = 0
        self.attempt = attempt

    def __call__(self, recipient: str, **kwargs: Any) -> SignalHandle:
        self.calls += 1
        options = {**self.defaults, **kwargs}
        rerun = f"@rerun{self.attempt}" if self.attempt > 1 else ""
        if (self.calls > 1 or rerun) and "idempotency_key" not in options:
            number = f"#{self.calls}" if self.calls > 1 else ""
            options["idempotency_key"] = f"{self.run_id}:{self.test_case}{number}{rerun}"
        return self.client.watch(self.run_id, self.test_case, recipient, **options)

    def none(self, recipient: str, **kwargs: Any) -> SignalHandle:
        """Assert that no matching email arrives before the deadline (see
        :meth:`Signalbox.expect_none`)."""
        return self(recipient, expect="none", **kwargs)

    def exactly_one(
        self, recipient: str, settle_seconds: int | None = None, **kwargs: Any
    ) -> SignalHandle:
        """Assert that exactly one matching email arrives (see
        :meth:`Signalbox.expect_exactly_one`)."""
        return self(recipient, expect="exactly_one", settle_seconds=settle_seconds, **kwargs)
