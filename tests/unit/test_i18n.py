"""The blueprint's translations: the catalogue covers every string, ships compiled, works.

The catalogue's sources are the ``.po`` files; the ``.mo`` files beside them are what
Flask-Babel reads (and what the wheel ships), so a stale ``.mo`` or a string missing
from the catalogue fails here, not in front of a German reader.
"""

from __future__ import annotations

import gettext as stdlib_gettext
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from flask import Flask
from flask_babel import Babel
from jinja2 import Environment

from flask_defer import i18n

ROOT = Path(__file__).resolve().parent.parent.parent
LOCALES = ("de", "fr")
KEYWORDS = {
    "defer_gettext": None,
    "defer_ngettext": (1, 2),
    "defer_pgettext": ((1, "c"), 2),
    "N_": None,
    "t": None,
    "gettext": None,
    "ngettext": (1, 2),
}


def extracted_ids() -> set[str]:
    """Every translatable string of the package and its templates, as pybabel sees them."""
    method_map = [("flask_defer/**.py", "python"), ("templates/defer/**.html", "jinja2")]
    found = set()
    for _file, _line, message, _comments, _context in extract_from_dir(
        str(ROOT), method_map, keywords=KEYWORDS
    ):
        found.add(message if isinstance(message, str) else message[0])
    return found


def catalogue(locale: str) -> dict[str, str]:
    path = i18n.TRANSLATIONS_DIR / locale / "LC_MESSAGES" / "flask_defer.po"
    with path.open("rb") as handle:
        po = read_po(handle, locale=locale)
    found = {}
    for m in po:
        if not m.id or "fuzzy" in m.flags:
            continue
        # A plural message's id and string are tuples: every form must be translated.
        forms = (m.string,) if isinstance(m.string, str) else tuple(m.string)
        if all(forms):
            found[m.id if isinstance(m.id, str) else m.id[0]] = forms[0]
    return found


@pytest.mark.parametrize("locale", LOCALES)
def test_every_string_of_the_blueprint_is_translated(locale: str) -> None:
    ids = extracted_ids()
    assert "Undo" in ids and "{label} Press Z to undo." in ids  # the extraction works
    missing = sorted(ids - set(catalogue(locale)))
    assert missing == [], f"untranslated in {locale}: {missing}"


@pytest.mark.parametrize("locale", LOCALES)
def test_the_compiled_catalogue_matches_its_source(locale: str) -> None:
    folder = i18n.TRANSLATIONS_DIR / locale / "LC_MESSAGES"
    with (folder / "flask_defer.po").open("rb") as handle:
        po = read_po(handle, locale=locale)
    fresh = io.BytesIO()
    write_mo(fresh, po)
    fresh.seek(0)
    expected = stdlib_gettext.GNUTranslations(fresh)
    with (folder / "flask_defer.mo").open("rb") as handle:
        shipped = stdlib_gettext.GNUTranslations(handle)
    for message in catalogue(locale):
        assert shipped.gettext(message) == expected.gettext(message), (
            f"{locale}: flask_defer.mo is stale; run `make translations`"
        )


def test_gettext_follows_the_apps_babel_locale() -> None:
    app = Flask(__name__)
    Babel(app, locale_selector=lambda: "de")
    with app.test_request_context():
        assert i18n.gettext("Undo") == "Rückgängig"
        assert i18n.gettext("{label} Press Z to undo.", label="Gesendet.") == (
            "Gesendet. Drücken Sie Z zum Rückgängigmachen."
        )
        assert i18n.locale_tag() == "de"
        assert i18n.format_seconds(4.2) == "5 Sek."


def test_without_babel_on_the_app_the_texts_are_english() -> None:
    app = Flask(__name__)
    with app.test_request_context():
        assert i18n.gettext("Undo") == "Undo"
        assert i18n.gettext("Too late — already {done}.", done="sent") == (
            "Too late — already sent."
        )
        assert i18n.locale_tag() is None
        assert i18n.format_seconds(4.2) == "5 s"
    assert i18n.gettext("Undo") == "Undo"  # outside any app, too


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (4.2, "5 s"), (59, "59 s"), (61, "1 min"), (7200, "2 h"), (7500, "2 h 5 min")],
)
def test_plain_seconds_are_short_english_durations(seconds: float, text: str) -> None:
    assert i18n.plain_seconds(seconds) == text


#: Attributes a reader sees or hears (tooltips, placeholders, screen-reader names, the
#: question htmx asks before a destructive action).
VISIBLE_ATTRIBUTES = {"title", "placeholder", "aria-label", "alt", "hx-confirm"}
#: Literal text that is the same in every language: the product's name, arrows, marks.
UNTRANSLATED_OK = {"flask_defer"}
KEBAB = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")
#: Elements whose text is code or data, not words.
CODE_ELEMENTS = {"code", "pre", "script", "style", "svg"}


class _LiteralFinder(HTMLParser):
    """Collects English literals in a template's static HTML (Jinja replaced by a mark)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._code_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in CODE_ELEMENTS:
            self._code_depth += 1
        for name, value in attrs:
            if name in VISIBLE_ATTRIBUTES and value:
                self._check(value, f"{tag}[{name}]")

    def handle_endtag(self, tag: str) -> None:
        if tag in CODE_ELEMENTS and self._code_depth:
            self._code_depth -= 1

    def handle_data(self, data: str) -> None:
        if not self._code_depth:
            self._check(data, "text")

    def _check(self, text: str, where: str) -> None:
        words = re.findall(r"[^\W\d_][\w.'’-]*", text.replace(MARK, " "))
        # kebab-case is a class or attribute name written outside a tag (a block that
        # fills class="...", a macro that renders attributes), not a word for a reader.
        words = [w for w in words if w not in UNTRANSLATED_OK and not KEBAB.fullmatch(w)]
        if words:
            self.found.append(f"{where}: {' '.join(words)}")


#: What every Jinja tag or expression becomes before the HTML is parsed.
MARK = "\x00"


def english_literals(source: str) -> list[str]:
    """The user-visible words of *source* written outside any ``{{ ... }}`` / ``{% %}``."""
    env = Environment()
    static = "".join(
        value if kind == "data" else (MARK if kind.endswith("_begin") else "")
        for _line, kind, value in env.lex(source)
    )
    finder = _LiteralFinder()
    finder.feed(static)
    finder.close()
    return finder.found


DASHBOARD_TEMPLATES = sorted(
    path.name
    for path in (ROOT / "templates" / "defer").glob("*.html")
    if "dashboard" in path.name
)


def test_the_literal_finder_sees_text_and_visible_attributes_but_not_code() -> None:
    source = (
        '<h1>{{ defer_gettext("Jobs") }} · flask_defer</h1><p>Owed {{ n }}</p>'
        '<input placeholder="Any name" value="x"><code>defer.recurring(...)</code> defer-dash'
        "{# a comment #}{% if x %}<span title=\"{{ t }}\">"
        "{{ defer_gettext('ok') }}</span>{% endif %}"
    )
    assert english_literals(source) == ["text: Owed", "input[placeholder]: Any name"]


@pytest.mark.parametrize("name", DASHBOARD_TEMPLATES)
def test_no_dashboard_template_holds_an_untranslated_english_literal(name: str) -> None:
    assert len(DASHBOARD_TEMPLATES) >= 10  # the glob found the dashboard's templates
    source = (ROOT / "templates" / "defer" / name).read_text(encoding="utf-8")
    assert english_literals(source) == [], f"{name}: wrap these in defer_gettext(...)"


def documented_selector() -> str:
    """The locale selector block of docs/undo.md, as an app would paste it."""
    text = (ROOT / "docs" / "undo.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- i18n:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert match, "docs/undo.md lost its locale selector example"
    return match.group(1)


def test_babel_alone_serves_english_to_a_german_browser_as_the_docs_say() -> None:
    app = Flask(__name__)
    Babel(app)
    with app.test_request_context(headers={"Accept-Language": "de"}):
        assert i18n.gettext("Undo") == "Undo"
    assert "`Babel(app)` alone is not enough" in (ROOT / "docs" / "undo.md").read_text()


@pytest.mark.parametrize(
    ("accept", "chosen", "undo"),
    [
        ("de-DE,de;q=0.9,en;q=0.5", None, "Rückgängig"),
        ("fr", None, "Annuler"),
        ("de", "fr", "Annuler"),  # the reader's own choice wins over the browser's
        ("ja", None, "Undo"),  # a language flask_defer has no catalogue for
    ],
)
def test_the_documented_locale_selector_serves_the_browsers_or_the_chosen_language(
    accept: str, chosen: str | None, undo: str
) -> None:
    app = Flask(__name__)
    app.secret_key = "test"
    exec(documented_selector(), {"app": app})
    with app.test_request_context(headers={"Accept-Language": accept}):
        from flask import session

        if chosen is not None:
            session["language"] = chosen
        assert i18n.gettext("Undo") == undo
