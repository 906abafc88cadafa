"""Which due times a beat that was down sends, records as missed, or leaves to come: the pure
arithmetic of :func:`workers.scheduling.catch_up` on Celery's own schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery.schedules import crontab
from celery.schedules import schedule as interval

from workers.scheduling import catch_up

WINDOW = timedelta(minutes=10)


def _at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC)


def test_a_daily_run_missed_by_hours_is_recorded_and_the_next_is_not_sent_early():
    daily = crontab(minute="0", hour="7")
    missed, due = catch_up(daily, _at(2, 7), _at(3, 9, 30), WINDOW)
    assert missed is not None and (missed.count, missed.oldest, missed.newest) == (
        1,
        _at(3, 7),
        _at(3, 7),
    )
    assert due == _at(4, 7)  # tomorrow's, in the future: the beat waits for it


def test_a_daily_run_due_within_the_window_is_sent_late_not_missed():
    missed, due = catch_up(crontab(minute="0", hour="7"), _at(2, 7), _at(3, 7, 4), WINDOW)
    assert missed is None and due == _at(3, 7)


def test_an_interval_down_for_an_hour_sends_the_last_ten_minutes_and_records_the_rest():
    every_minute = interval(run_every=timedelta(minutes=1))
    missed, due = catch_up(every_minute, _at(3, 8), _at(3, 9), WINDOW)
    assert missed is not None and missed.count == 49
    assert (missed.oldest, missed.newest) == (_at(3, 8, 1), _at(3, 8, 49))
    assert due == _at(3, 8, 50)  # then 8:51 … 9:00, each sent


def test_an_entry_that_never_ran_is_sent_now():
    now = _at(3, 9)
    assert catch_up(crontab(minute="0", hour="7"), None, now, WINDOW) == (None, now)
