"""Who owns a toast: Flask-Login's user, else a per-browser id, or the app's own loader."""

from __future__ import annotations

import pytest
from flask import Flask
from flask_login import LoginManager, UserMixin, login_user

from flask_defer import Defer, NotConfigured
from flask_defer.features.owner import BROWSER_PREFIX, SESSION_KEY, default_owner, resolve_owner


class User(UserMixin):
    def __init__(self, user_id: str) -> None:
        self.id = user_id


def make_app(login: bool = False) -> tuple[Flask, Defer]:
    app = Flask("owner_test")
    app.config.update(SECRET_KEY="s", DEFER_DATABASE_URI="sqlite://")
    defer = Defer(app)
    if login:
        manager = LoginManager(app)
        manager.user_loader(lambda user_id: User(user_id))
    return app, defer


def dispose(app: Flask) -> None:
    app.extensions["defer"].store.engine.dispose()


def test_an_anonymous_browser_gets_an_id_only_when_asked_to_create_one() -> None:
    app, defer = make_app()
    with app.test_request_context("/"):
        from flask import session

        assert defer.current_owner() is None
        assert SESSION_KEY not in session
        owner = defer.current_owner(create=True)
        assert owner is not None and owner.startswith(BROWSER_PREFIX)
        assert len(owner) > len(BROWSER_PREFIX) + 20
        assert defer.current_owner() == owner
        assert session[SESSION_KEY] == owner
    dispose(app)


def test_the_browser_id_lives_in_the_signed_session_cookie() -> None:
    app, defer = make_app()

    @app.get("/make")
    def make() -> str:
        return defer.current_owner(create=True) or ""

    @app.get("/read")
    def read() -> str:
        return defer.current_owner() or "-"

    browser = app.test_client()
    owner = browser.get("/make").get_data(as_text=True)
    assert browser.get("/read").get_data(as_text=True) == owner
    assert app.test_client().get("/read").get_data(as_text=True) == "-"
    dispose(app)


def test_a_forged_session_value_is_not_an_owner() -> None:
    app, defer = make_app()
    with app.test_request_context("/"):
        from flask import session

        session[SESSION_KEY] = "alice"  # not a browser id: a value we never issued
        assert defer.current_owner() is None
    dispose(app)


def test_flask_login_user_wins_over_the_browser_id() -> None:
    app, defer = make_app(login=True)
    with app.test_request_context("/"):
        anonymous = defer.current_owner(create=True)
        assert anonymous is not None and anonymous.startswith(BROWSER_PREFIX)
        login_user(User("42"))
        assert defer.current_owner() == "42"
        assert default_owner(create=True) == "42"
    dispose(app)


def test_outside_a_request_there_is_no_owner() -> None:
    app, defer = make_app()
    with app.app_context():
        assert defer.current_owner(create=True) is None
    dispose(app)


def test_the_apps_owner_loader_replaces_the_default() -> None:
    app, defer = make_app()

    @defer.owner_loader
    def tenant_user() -> str | None:
        return "tenant-7:user-3"

    with app.test_request_context("/"):
        assert defer.current_owner() == "tenant-7:user-3"
    dispose(app)


@pytest.mark.parametrize("bad", [42, "", "x" * 256])
def test_an_owner_loader_must_return_text(bad: object) -> None:
    with pytest.raises(TypeError, match="owner loader"):
        resolve_owner(lambda: bad, create=False)  # type: ignore[arg-type, return-value]


def test_owner_loader_must_be_callable() -> None:
    app, defer = make_app()
    with pytest.raises(TypeError):
        defer.owner_loader("not a function")  # type: ignore[arg-type]
    dispose(app)


def test_undoable_without_a_secret_key_raises_not_configured_naming_it_and_writes_no_row() -> None:
    app = Flask("no_secret")
    app.config.update(DEFER_DATABASE_URI="sqlite://")
    defer = Defer(app)  # a worker-only app needs no secret key: init_app accepts it

    @defer.job("send_email")
    def send_email(job: object) -> None:
        pass

    with app.test_request_context("/"):
        with pytest.raises(NotConfigured, match="SECRET_KEY"):
            defer.undoable("send_email")
        assert defer.list() == []
    dispose(app)

