"""Two demo users and a session-based sign-in, so the ownership of toasts is visible.

Signing in stores the user's id in Flask's signed session cookie. The same id is the
``owner`` of every job the user causes (see the ``@defer.owner_loader`` in
``demo_app/__init__.py``), so Alice's Undo toasts never show up for Bob.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    abort,
    flash,
    g,
    has_request_context,
    redirect,
    render_template,
    request,
    session,
    url_for,
)


@dataclass(frozen=True)
class User:
    id: str
    name: str
    role: str
    colour: str

    @property
    def initial(self) -> str:
        return self.name[:1]


USERS = {
    "alice": User("alice", "Alice", "writes the blog, runs projects", "#7c3aed"),
    "bob": User("bob", "Bob", "comments on everything", "#0891b2"),
}

#: Endpoints a visitor may see without signing in.
PUBLIC_ENDPOINTS = {"users.sign_in", "users.sign_in_post", "static", "defer.static", "defer.toasts",
                    "language.choose", "automation.webhook"}

bp = Blueprint("users", __name__)


def current_user() -> User | None:
    """The signed-in demo user of this request, or None (also outside a request)."""
    if not has_request_context():
        return None
    if "user" not in g:
        g.user = USERS.get(session.get("user", ""))
    user: User | None = g.user
    return user


def require_user() -> User:
    user = current_user()
    if user is None:  # pragma: no cover - the before_request guard redirects first
        abort(401)
    return user


def require_sign_in() -> Any:
    """``before_request``: send visitors who are not signed in to the sign-in page."""
    if request.endpoint in PUBLIC_ENDPOINTS or request.endpoint is None:
        return None
    if current_user() is None:
        return redirect(url_for("users.sign_in", next=request.full_path.rstrip("?")))
    return None


def _local(target: str | None) -> str | None:
    """*target* if it is a path on this site (never another host), else None."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else None


@bp.get("/sign-in")
def sign_in() -> Any:
    return render_template("sign_in.html", users=USERS.values(), next=request.args.get("next"))


@bp.post("/sign-in")
def sign_in_post() -> Any:
    user = USERS.get(request.form.get("user", ""))
    if user is None:
        abort(400, description="Pick Alice or Bob.")
    # A new identity gets a fresh session (and CSRF token), as a real sign-in would.
    language = session.get("language")
    session.clear()
    session["user"] = user.id
    if language is not None:  # the reader's language survives the change of identity
        session["language"] = language
    flash(f"Signed in as {user.name}.", "info")
    return redirect(_local(request.form.get("next")) or url_for("mail.index"), code=303)


@bp.post("/sign-out")
def sign_out() -> Any:
    session.clear()
    return redirect(url_for("users.sign_in"), code=303)
