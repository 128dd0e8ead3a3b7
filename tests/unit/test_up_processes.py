"""`up` gives the API half the usable cores (at least one): the sink, the
workers and PostgreSQL share the machine with it."""

from __future__ import annotations

import os

import pytest

from app.cli import up
from app.settings import Settings


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4)])
def test_api_processes_are_half_the_usable_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert up.api_processes() == expected


def test_the_api_child_gets_them_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("SIGNALBOX_API_WORKERS", raising=False)
    settings = Settings()
    assert up._child_env("api", settings)["SIGNALBOX_API_WORKERS"] == "4"
    monkeypatch.setenv("SIGNALBOX_API_WORKERS", "3")
    assert up._child_env("api", settings)["SIGNALBOX_API_WORKERS"] == "3"
