"""Callbacks told of every bound a parse hits: the only side effect of parsing."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from app.domain.mail.parsed import BOUND_DEFECT_PREFIX

_BOUND_OBSERVERS: list[Callable[[str], None]] = []


def on_bound_exceeded(observer: Callable[[str], None]) -> None:
    """Call ``observer(bound)`` for every bound a later :func:`parse_mail` hits
    in this process (a parse in another process reports to that process)."""
    if observer not in _BOUND_OBSERVERS:
        _BOUND_OBSERVERS.append(observer)


def report_bounds(defects: tuple[str, ...]) -> None:
    """Tell the observers of the bounds named in ``defects``. :func:`parse_mail`
    does it itself; call it for a result parsed in another process."""
    for defect in defects:
        if not defect.startswith(BOUND_DEFECT_PREFIX):
            continue
        for observer in list(_BOUND_OBSERVERS):
            with suppress(Exception):  # an observer never breaks parsing
                observer(defect[len(BOUND_DEFECT_PREFIX) :])
