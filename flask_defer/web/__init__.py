"""The ``defer`` blueprint: the Undo toasts and pending page, the operator dashboard.

The web layer holds no SQL: every view calls the :class:`~flask_defer.Defer` facade
and maps its errors (:class:`~flask_defer.JobNotFound` → 404). Templates live under
``defer/`` so an app overrides any of them from its own ``templates/defer/`` folder
(Flask searches the app's templates before a blueprint's).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, Response, g, has_request_context, render_template, request

from .. import signals
from ..config import DeferConfig
from ..errors import NotConfigured
from ..jobs import Job
from . import dashboard, undo_views
from .csrf import csrf_token
from .headers import security_headers
from .resources import static_dir, templates_dir
from .toasts import defer_toasts

#: The event htmx fires on ``body`` when a response carries ``HX-Trigger: defer-toasts``;
#: the toast container listens for it and fetches new toasts.
REFRESH_EVENT = "defer-toasts"


def create_blueprint() -> Blueprint:
    """A fresh ``defer`` blueprint (one per app, so each app may mount it elsewhere).

    Its security headers (``nosniff``, ``frame-ancestors``) are added by
    :func:`init_web` for every path under the prefix, 404s included
    (:mod:`.headers`).
    """
    blueprint = Blueprint(
        "defer",
        __name__,
        template_folder=str(templates_dir()),
        static_folder=str(static_dir()),
        static_url_path="/static",
    )
    undo_views.register(blueprint)
    # -- the operator dashboard and metrics --
    dashboard.register(blueprint)
    blueprint.register_error_handler(NotConfigured, _not_configured)
    return blueprint


def _not_configured(error: NotConfigured) -> tuple[str, int]:
    """A page that names the missing setting (a bare 500 would send the operator to
    the logs); the layout is not used, as it needs what is missing."""
    return render_template("defer/not_configured.html", message=str(error)), 500


def init_web(app: Flask, config: DeferConfig) -> None:
    """Register the blueprint, the Jinja globals and the htmx refresh trigger on *app*."""
    app.register_blueprint(create_blueprint(), url_prefix=config.url_prefix)
    app.after_request(security_headers(config.url_prefix, config.frame_ancestors))
    app.add_template_global(defer_toasts, "defer_toasts")
    app.add_template_global(csrf_token, "defer_csrf_token")
    signals.job_scheduled.connect(_note_new_toast, sender=app)
    app.after_request(_trigger_toast_refresh)


def _note_new_toast(sender: Any, job: Job, **_: Any) -> None:
    if job.undo_until is not None and has_request_context():
        g._defer_new_toast = True


def _trigger_toast_refresh(response: Response) -> Response:
    """Tell htmx to refresh the toasts after an htmx request that made an undoable job.

    So an app whose Send button is an htmx request shows the toast without a reload
    and without any code of its own.
    """
    if not g.get("_defer_new_toast") or request.headers.get("HX-Request") != "true":
        return response
    existing = response.headers.get("HX-Trigger")
    if not existing:
        response.headers["HX-Trigger"] = REFRESH_EVENT
    elif existing.lstrip().startswith("{"):
        import json

        try:
            events = json.loads(existing)
        except ValueError:
            return response
        if isinstance(events, dict):
            events.setdefault(REFRESH_EVENT, True)
            response.headers["HX-Trigger"] = json.dumps(events)
    elif REFRESH_EVENT not in {name.strip() for name in existing.split(",")}:
        response.headers["HX-Trigger"] = f"{existing}, {REFRESH_EVENT}"
    return response
