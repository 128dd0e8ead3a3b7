"""A refused delivery is recorded in PostgreSQL and logged with its reason,
the SMTP reply code (field `status_code`) and its recipients only as hashes."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from app.db.engine import autocommit
from app.infra.keys import recipient_hash
from app.settings import get_settings
from app.usecases import refusals

pytestmark = pytest.mark.integration


def test_a_refusal_is_stored_and_its_line_names_no_address(
    in_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    settings = get_settings()
    item = refusals.refusal_item(550, "recipient_domain", "not accepted here", ["To@Other.test"])
    with caplog.at_level(logging.INFO, logger="signalbox.sink"):
        refusals.record_many(settings, [item])
    lines = [r for r in caplog.records if getattr(r, "event", None) == "smtp_refused"]
    assert [(r.reason, r.status_code, r.recipient_hashes) for r in lines] == [  # type: ignore[attr-defined]
        ("recipient_domain", 550, [recipient_hash("to@other.test", settings)])
    ]
    assert "to@other.test" not in caplog.text.lower()
    with autocommit() as session:
        stored = session.execute(text("SELECT code, reason, recipients FROM smtp_refusals")).all()
    assert [tuple(row) for row in stored] == [(550, "recipient_domain", ["to@other.test"])]
