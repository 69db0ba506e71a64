"""The dashboard's Queues page: each queue and job name, its live jobs, pause and resume.

Closed like the rest of the dashboard (the authorisation hook, else 403), and both
actions are CSRF-protected POSTs calling one facade method each, so the page, ``flask
defer pause`` and Python pause a queue through the same statement. The queue or name
travels in the form (``kind`` and ``value``), not in the URL: names may hold any
character, a slash included.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from flask import Blueprint, abort, render_template, request, url_for
from flask.typing import ResponseReturnValue

from ..errors import InvalidArgument
from ..facade import DeferFacade
from ..i18n import N_, gettext
from ..timeutil import utcnow
from .access import current_defer, operator, operators_only, require_operator
from .csrf import require_csrf
from .dashboard_actions import ActionOutcome, answer
from .pages import form_context, page_context, refresh_seconds, uncached_page, wants_fragment

#: The outcome sentences, by (action, kind, changed), each a catalogue message.
SENTENCES = {
    ("pause", "queue", True): N_("Queue {value} paused: its jobs wait until it is resumed."),
    ("pause", "queue", False): N_("Queue {value} was already paused."),
    ("pause", "name", True): N_("Job name {value} paused: its jobs wait until it is resumed."),
    ("pause", "name", False): N_("Job name {value} was already paused."),
    ("resume", "queue", True): N_("Queue {value} resumed: its due jobs start now."),
    ("resume", "queue", False): N_("Queue {value} was not paused."),
    ("resume", "name", True): N_("Job name {value} resumed: its due jobs start now."),
    ("resume", "name", False): N_("Job name {value} was not paused."),
}


def register(blueprint: Blueprint) -> None:
    """Add the Queues page (GET) and its actions (POST) to *blueprint*."""
    blueprint.add_url_rule("/queues", "dashboard_queues", queues_page, methods=["GET"])
    blueprint.add_url_rule("/queues/pause", "dashboard_queue_pause", pause, methods=["POST"])
    blueprint.add_url_rule("/queues/resume", "dashboard_queue_resume", resume, methods=["POST"])


def dom_id(kind: str, value: str) -> str:
    """A stable element id for a queue's or name's row (any characters → hex).

    Stable across refreshes, so htmx puts the keyboard focus back on the same row's
    button after the table swaps in.
    """
    digest = hashlib.sha256(f"{kind}:{value}".encode()).hexdigest()[:12]
    return f"defer-{kind}-{digest}"


@operators_only
def queues_page() -> ResponseReturnValue:
    """Every queue and job name known, with pending, due and running jobs and its state."""
    now = utcnow()
    rows = current_defer().queues(now=now)
    context = {
        "queues": [row for row in rows if row.kind == "queue"],
        "names": [row for row in rows if row.kind == "name"],
        "dom_id": dom_id,
        "now": now,
        "here": url_for("defer.dashboard_queues"),
        "refresh_seconds": refresh_seconds(),
        **form_context(),
    }
    if wants_fragment():
        return uncached_page(render_template("defer/_dashboard_queues.html", **context))
    return uncached_page(
        render_template("defer/dashboard_queues.html", **context, **page_context())
    )


def pause() -> ResponseReturnValue:
    """Pause the queue or name of the form; one already paused is reported as such."""
    return _switch("pause", DeferFacade.pause)


def resume() -> ResponseReturnValue:
    """Resume the queue or name of the form; one not paused is reported as such."""
    return _switch("resume", DeferFacade.resume)


def _switch(action: str, method: Callable[..., bool]) -> ResponseReturnValue:
    require_operator()
    require_csrf()
    kind = request.form.get("kind", "")
    value = request.form.get("value", "")
    if kind not in ("queue", "name"):
        abort(400, description=gettext("Say what to pause: a queue or a job name."))
    try:
        changed = method(current_defer(), **{kind: value}, actor=operator())
    except InvalidArgument as error:
        abort(400, description=error.message)
    return answer(ActionOutcome(changed, gettext(SENTENCES[action, kind, changed], value=value)))
