"""Small response helpers shared by the Undo views and the dashboard."""

from __future__ import annotations

from typing import Any

from flask import Response, current_app, request
from flask.typing import ResponseReturnValue

#: What :func:`safe_json` writes instead of the characters HTML gives a meaning to.
#: They can only occur inside JSON strings, where the escape means the same character.
HTML_SAFE_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "'": "\\u0027"})


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


def safe_json(status: int = 200, **values: Any) -> Response:
    """A JSON response whose text holds no ``<``, ``>``, ``&`` or ``'``.

    Labels come from the app's users ("<script>…"). The page reads them with
    ``JSON.parse`` and inserts them as text, but a client that sniffs the body as HTML,
    or a page that embeds it in markup, must find nothing to run: each of those
    characters is written as its ``\\u`` escape (as ``htmlsafe_json_dumps`` does), which
    every JSON parser reads back as the same character.
    """
    text = current_app.json.dumps(values).translate(HTML_SAFE_ESCAPES)
    return current_app.response_class(text + "\n", status=status, mimetype="application/json")
