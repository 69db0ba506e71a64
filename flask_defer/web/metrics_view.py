"""``<prefix>/metrics``: the app's Prometheus metrics (``DEFER_METRICS = True``).

Closed like the dashboard (the ``@defer.dashboard_auth`` hook, or debug mode) unless
``DEFER_METRICS_PUBLIC`` is set, for a scraper that cannot log in. Without
``DEFER_METRICS`` the URL does not exist (404).
"""

from __future__ import annotations

from flask import Blueprint, Response, abort, request
from flask.typing import ResponseReturnValue

from .access import current_defer, require_operator


def register(blueprint: Blueprint) -> None:
    """Add the metrics endpoint to *blueprint*."""
    blueprint.add_url_rule("/metrics", "metrics", metrics, methods=["GET"])


def metrics() -> ResponseReturnValue:
    """The metrics in the exposition format the scraper accepts."""
    defer = current_defer()
    metrics = defer.metrics
    if metrics is None:
        abort(404)
    if not defer.config.metrics_public:
        require_operator()
    body, content_type = metrics.exposition(request.headers.get("Accept"))
    return Response(body, content_type=content_type, headers={"Cache-Control": "no-store"})
