"""Outcomes and run summaries (outcomes.py): the worker's progress line."""

from __future__ import annotations

import logging

import pytest

from flask_defer.engine.outcomes import Outcome, ProgressLog, RunSummary


def test_the_progress_line_says_what_ran_since_the_last_one_and_nothing_when_idle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("flask_defer.worker")
    summary = RunSummary()
    progress = ProgressLog(log, interval=0.0)
    with caplog.at_level(logging.INFO, logger="flask_defer"):
        for outcome in (Outcome.DONE, Outcome.DONE, Outcome.RETRIED):
            summary.add(outcome)
        progress.maybe_log(summary)
        progress.maybe_log(summary)  # nothing new: no line
        summary.add(Outcome.FAILED)
        progress.maybe_log(summary)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "ran 3 job(s) (done 2, retried 1) in the last 0 s",
        "ran 1 job(s) (failed 1) in the last 0 s",
    ]


def test_no_progress_line_before_its_interval(caplog: pytest.LogCaptureFixture) -> None:
    summary = RunSummary()
    summary.add(Outcome.DONE)
    with caplog.at_level(logging.INFO, logger="flask_defer"):
        ProgressLog(logging.getLogger("flask_defer.worker"), interval=60.0).maybe_log(summary)
    assert caplog.records == []
