"""`alembic upgrade head` gives exactly the schema the models describe, and
`signalbox-server db upgrade` applies it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from app.db.migrate import alembic_config, upgrade
from app.db.models import Base
from app.settings import to_sqlalchemy_url
from bench._mails import newsletter
from tests.stack import ROOT
from tests.stack_fixtures import PgServer, _libpq

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_database(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_empty_database(f"sbx_empty_{os.getpid()}")
    yield url
    pg_server.drop_database(url)


def test_upgrade_head_matches_the_models(empty_database: str) -> None:
    upgrade(empty_database)
    engine = create_engine(to_sqlalchemy_url(empty_database))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        triggers = conn.exec_driver_sql(
            "SELECT tgname FROM pg_trigger WHERE tgname = 'signals_notify'"
        ).all()
    engine.dispose()
    assert diff == []
    assert triggers == [("signals_notify",)]


def test_db_upgrade_command_migrates_an_empty_database(empty_database: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(SIGNALBOX_DATABASE_URL=empty_database, SIGNALBOX_BROKER_URL="redis://127.0.0.1:1/0")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(_libpq(empty_database)) as conn:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
    assert version == (head,)


def _waiting_counts(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT namespace, sum(waiting) FROM namespace_waiting GROUP BY namespace"
        " HAVING sum(waiting) <> 0"
    ).fetchall()
    return {ns: int(n) for ns, n in rows}


def test_waiting_counts_start_from_the_signals_already_waiting_and_follow_them(
    empty_database: str,
) -> None:
    """Migration 0005 counts the signals waiting before it, then its trigger
    follows every insert, status change, delete and TRUNCATE."""
    upgrade(empty_database, "0004")
    rows = [("a", "waiting"), ("a", "waiting"), ("a", "found"), ("b", "waiting")]
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        for i, (namespace, status) in enumerate(rows):
            conn.execute(
                "INSERT INTO signals (id, namespace, idempotency_key, run_id, test_case,"
                " recipient, received_after, expires_at, max_checks, provider, status,"
                " max_claims, next_check_at)"
                " VALUES (%s, %s, %s, 'r', 't', 'x@example.test', now(),"
                " now() + interval '1 hour', 5, 'sink', %s, 3, now())",
                (f"sig_{i}", namespace, f"key-{i}", status),
            )
    upgrade(empty_database)
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        assert _waiting_counts(conn) == {"a": 2, "b": 1}
        conn.execute("UPDATE signals SET status = 'found' WHERE id = 'sig_0'")
        conn.execute("UPDATE signals SET status = 'waiting' WHERE id = 'sig_2'")  # a redrive
        conn.execute("UPDATE signals SET metadata = '{}' WHERE id = 'sig_1'")  # no status change
        assert _waiting_counts(conn) == {"a": 2, "b": 1}
        conn.execute("DELETE FROM signals WHERE id = 'sig_3'")
        conn.execute("DELETE FROM signals WHERE id = 'sig_0'")  # found: not counted
        assert _waiting_counts(conn) == {"a": 2}
        conn.execute("TRUNCATE signals CASCADE")
        assert conn.execute("SELECT count(*) FROM namespace_waiting").fetchone() == (0,)


def test_the_sink_recipient_index_keeps_no_pending_list(empty_database: str) -> None:
    """Migration 0006: every look at the sink searches this GIN index, and a
    search reads GIN's pending list in full; the index keeps none, and what
    was pending when it was turned off is merged. `gin_clean_pending_list`
    merges the list and answers how many pages it held."""
    index = "ix_sink_messages_all_recipients"
    rows = (
        "INSERT INTO sink_messages (envelope_recipients, all_recipients, size, raw)"
        " SELECT ARRAY['r' || g || '@example.test'], ARRAY['r' || g || '@example.test'],"
        " 1, '\\x00' FROM generate_series(1, 200) g"
    )
    upgrade(empty_database, "0005")
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(rows)  # pending under the default (fastupdate on)
    upgrade(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        (options,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = %s", [index]
        ).fetchone() or (None,)
        (left_pending,) = conn.execute(
            "SELECT gin_clean_pending_list(%s::regclass)", [index]
        ).fetchone() or (None,)
        conn.execute(rows)
        (newly_pending,) = conn.execute(
            "SELECT gin_clean_pending_list(%s::regclass)", [index]
        ).fetchone() or (None,)
    assert options == ["fastupdate=off"]
    assert left_pending == 0  # 0006 merged what the default had left pending
    assert newly_pending == 0  # and new rows go straight into the index


END_OF_STEPS = "end of steps"


def test_long_polls_are_woken_only_when_a_signal_stops_waiting(empty_database: str) -> None:
    """Migration 0007: a long poll waits only while its signal is `waiting`,
    so only a change out of `waiting` notifies; claims, consumes, releases,
    redrives and check updates wake no listener."""
    upgrade(empty_database)
    with (
        psycopg.connect(_libpq(empty_database), autocommit=True) as listener,
        psycopg.connect(_libpq(empty_database), autocommit=True) as conn,
    ):
        listener.execute("LISTEN signalbox_signal")
        for i in range(2):
            conn.execute(
                "INSERT INTO signals (id, namespace, idempotency_key, run_id, test_case,"
                " recipient, received_after, expires_at, max_checks, provider, status,"
                " max_claims, next_check_at)"
                " VALUES (%s, 'a', %s, 'r', 't', 'x@example.test', now(),"
                " now() + interval '1 hour', 5, 'sink', 'waiting', 3, now())",
                (f"sig_{i}", f"key-{i}"),
            )
        steps = [
            ("sig_0", "checks_count = checks_count + 1, last_outcome = 'provider_error'"),
            ("sig_0", "status = 'waiting'"),  # listed, not changed
            ("sig_0", "status = 'found'"),  # notifies
            ("sig_0", "status = 'claimed'"),
            ("sig_0", "status = 'found'"),  # a release
            ("sig_0", "status = 'claimed'"),
            ("sig_0", "status = 'consumed'"),
            ("sig_1", "status = 'expired'"),  # notifies
            ("sig_1", "status = 'waiting'"),  # a redrive
            ("sig_1", "checks_count = 1"),
        ]
        for signal_id, change in steps:
            conn.execute(f"UPDATE signals SET {change} WHERE id = %s", [signal_id])
        # A marker no signal id can be, sent after the steps by the same
        # connection: notifications arrive in commit order, so everything the
        # steps notified arrives before it, however late, and nothing after.
        conn.execute(f"NOTIFY signalbox_signal, '{END_OF_STEPS}'")
        woken: list[str] = []
        for note in listener.notifies(timeout=60.0):
            if note.payload == END_OF_STEPS:
                break
            woken.append(note.payload.partition(" ")[0])  # the id, then the view (0018)
        else:
            pytest.fail(f"the end-of-steps notification never came; got {woken}")
    assert woken == ["sig_0", "sig_1"]


def test_raw_message_bytes_are_stored_compressed_with_lz4_where_the_server_has_it(
    empty_database: str,
) -> None:
    """Migration 0016: both raw columns name lz4 when this server was built
    with it (pglz otherwise), and a typical 20 KB HTML newsletter then costs
    at most half its size in each table. Downgrading returns them to the
    server's default."""
    upgrade(empty_database)
    raw = newsletter("reader@example.test", seed=7)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        (offered,) = conn.execute(
            "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
        ).fetchone() or (None,)
        method = "lz4" if "lz4" in offered else "pglz"
        columns = conn.execute(
            "SELECT attrelid::regclass::text, attcompression FROM pg_attribute"
            " WHERE attname = 'raw'"
            " AND attrelid IN ('messages'::regclass, 'sink_messages'::regclass) ORDER BY 1"
        ).fetchall()
        conn.execute(
            "INSERT INTO sink_messages (envelope_recipients, all_recipients, size, raw)"
            " VALUES (ARRAY['reader@example.test'], ARRAY['reader@example.test'], %s, %s)",
            [len(raw), raw],
        )
        conn.execute(
            "INSERT INTO messages (id, provider, provider_message_id, received_at, recipients, raw)"
            " VALUES ('msg_1', 'sink', '1', now(), ARRAY['reader@example.test'], %s)",
            [raw],
        )
        # As stored (RETURNING would show the value before TOAST compressed it).
        stored = conn.execute(
            "SELECT pg_column_size(raw), pg_column_compression(raw) FROM sink_messages"
            " UNION ALL SELECT pg_column_size(raw), pg_column_compression(raw) FROM messages"
        ).fetchall()
    assert columns == [("messages", method[0]), ("sink_messages", method[0])]
    assert len(raw) > 19_000
    assert [m for _, m in stored] == [method, method]
    assert all(size <= len(raw) / 2 for size, _ in stored), stored

    command.downgrade(alembic_config(empty_database), "0010")
    with psycopg.connect(empty_database, autocommit=True) as conn:
        after = conn.execute(
            "SELECT attcompression FROM pg_attribute WHERE attname = 'raw'"
            " AND attrelid IN ('messages'::regclass, 'sink_messages'::regclass)"
        ).fetchall()
    assert after == [("",), ("",)]
