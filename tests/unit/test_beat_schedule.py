"""Beat's schedule: nothing runs every few seconds for a feature that is off."""

from __future__ import annotations

from celery import Celery

from app.settings import load_settings
from workers.celery_app import configure


def _schedule(**settings: object) -> dict[str, object]:
    app = configure(Celery("beat-schedule-test"), load_settings(**settings))
    return dict(app.conf.beat_schedule)


def test_no_webhook_outbox_task_is_scheduled_without_a_webhook() -> None:
    assert "webhooks" not in _schedule(dead_letter_webhook_url="")
    assert {"sweep", "late-watch", "retention"} <= set(_schedule(dead_letter_webhook_url=""))


def test_the_webhook_outbox_is_polled_when_a_webhook_is_configured() -> None:
    schedule = _schedule(
        dead_letter_webhook_url="http://hooks.test/dead-letters", webhook_poll_seconds=7
    )
    entry = schedule["webhooks"]
    assert isinstance(entry, dict) and entry["schedule"].total_seconds() == 7
