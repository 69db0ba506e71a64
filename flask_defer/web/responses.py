"""Small response helpers shared by the Undo views and the dashboard."""

from __future__ import annotations

from flask import Response, current_app, request
from flask.typing import ResponseReturnValue


def is_htmx() -> bool:
    """True for a request htmx made (it sends ``HX-Request: true``)."""
    return request.headers.get("HX-Request") == "true"


def no_store(body: ResponseReturnValue, *, vary_htmx: bool = False) -> Response:
    """A response no cache keeps: remaining seconds and figures are only true when rendered.

    ``vary_htmx`` adds ``Vary: HX-Request`` for a URL that serves both a page and its
    htmx fragment.
    """
    response = current_app.make_response(body)
    response.headers["Cache-Control"] = "no-store"
    if vary_htmx:
        response.headers["Vary"] = "HX-Request"
    return response
