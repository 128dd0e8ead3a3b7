"""The sink's store (app/usecases/intake.py:store_many), on the test's own
PostgreSQL: the SMTP sink answers `250` when it returns, so its one
statement must be committed by then (its own transaction, one round trip),
and a batch that fails stores none of its messages."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.exc import SQLAlchemyError

from app.db import sink_messages as sink_messages_db
from app.settings import get_settings
from app.usecases import intake
from tests.integration.helpers import mail
from tests.integration.looks import sql

pytestmark = pytest.mark.integration


def stored(ids: list[int]) -> list[tuple[Any, ...]]:
    return sql(
        "SELECT id, envelope_recipients, size FROM sink_messages WHERE id = ANY(%s) ORDER BY id",
        ids,
    )


def sink_rows() -> int:
    ((n,),) = sql("SELECT count(*) FROM sink_messages")
    return int(n)


def test_a_stored_batch_is_committed_when_the_store_returns_in_one_round_trip(
    in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    autocommitted: list[bool] = []
    real = sink_messages_db.sink_messages_store

    def spy(session: Any, items: Any) -> Any:
        # A connection in a transaction would send BEGIN first and need a
        # COMMIT after: three round trips, and the commit the caller's.
        autocommitted.append(bool(session.connection.driver_connection.autocommit))
        return real(session, items)

    monkeypatch.setattr(sink_messages_db, "sink_messages_store", spy)
    to = [f"st-{uuid.uuid4().hex[:8]}@example.test" for _ in range(3)]
    received = [("app@example.test", [t.upper()], mail(t)) for t in to]
    answered = intake.store_many(get_settings(), received)
    ids = [s.sink_id for s in answered]
    # Each has its own `msg_` id from the moment it is stored.
    assert len({s.message_id for s in answered}) == 3
    assert all(s.message_id.startswith("msg_") for s in answered)
    assert autocommitted == [True]
    assert len(ids) == 3 and ids == sorted(ids)
    # Seen at once from another connection, in the order given.
    assert stored(ids) == [(i, [t], len(mail(t))) for i, t in zip(ids, to, strict=True)]


def test_a_batch_that_fails_stores_none_of_its_messages(in_process: None) -> None:
    before = sink_rows()
    good = ("app@example.test", ["ok@example.test"], mail("ok@example.test"))
    bad = ("app\x00@example.test", ["bad@example.test"], mail("bad@example.test"))  # NUL: no text
    with pytest.raises(SQLAlchemyError):
        intake.store_many(get_settings(), [good, bad])
    assert sink_rows() == before
