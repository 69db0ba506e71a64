"""The security headers of every response under the blueprint's URL prefix.

They are added by an app-level hook that looks at the request's path, not by the
blueprint's own ``after_request``: a URL under the prefix that matches no route (a
404 or 405 from routing) never reaches the blueprint, and its error page must be
just as unframeable and unsniffable as the pages that exist.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response, request

#: What the hook does to a response.
ResponseHook = Callable[[Response], Response]


def security_headers(prefix: str, frame_ancestors: str | None) -> ResponseHook:
    """An after-request hook for every response whose path is *prefix* or below it.

    ``X-Content-Type-Options: nosniff`` always: a browser must not read a JSON answer
    (whose labels come from users) or a fragment as something else and run it. Then
    who may frame the response (``DEFER_FRAME_ANCESTORS``; ``None`` adds no framing
    header): an Undo button or a dashboard action shown in a stranger's invisible frame
    is a click the user never meant (clickjacking).
    """
    directive = f"frame-ancestors {frame_ancestors}" if frame_ancestors is not None else None
    # X-Frame-Options, for browsers without CSP level 2, can only say "same origin"
    # or "nowhere"; a list of hosts is left to the CSP header alone.
    legacy = {"'self'": "SAMEORIGIN", "'none'": "DENY"}.get((frame_ancestors or "").strip())
    below = prefix + "/"

    def add_headers(response: Response) -> Response:
        path = request.path
        if path != prefix and not path.startswith(below):
            return response  # the app's own pages are the app's business
        response.headers["X-Content-Type-Options"] = "nosniff"
        if directive is not None:
            policy = response.headers.get("Content-Security-Policy")
            if not policy:
                response.headers["Content-Security-Policy"] = directive
            elif "frame-ancestors" not in policy:
                response.headers["Content-Security-Policy"] = (
                    f"{policy.rstrip('; ')}; {directive}"
                )
        if legacy is not None:
            response.headers.setdefault("X-Frame-Options", legacy)
        return response

    return add_headers
