# Common developer tasks. Every target installs what it needs first, so a
# fresh checkout on Debian only needs `make test`.

PYTEST_ARGS ?=
# Test processes (pytest-xdist). Most of the suite waits on worker processes, sleeps and
# Chromium rather than on the CPU: on two busy cores the full run took 993 s in one
# process, 412-529 s in four. Three leave the timing-sensitive tests (browser countdowns,
# write-lock hand-offs) more headroom. Each process starts its own PostgreSQL server and
# Chromium (tests/conftest.py). `make test PYTEST_WORKERS=0` runs in one process (-s, --pdb).
PYTEST_WORKERS ?= 3

.PHONY: venv test screenshots lint demo bench translations docs

# The test run caches compiled bytecode (__pycache__, git-ignored) even where the
# environment sets PYTHONDONTWRITEBYTECODE, as container images often do: without the
# cache every test process and every Python subprocess the suite starts (workers, CLI,
# demo) compiles flask_defer anew (0.3 s of each import), and pytest rewrites every test
# module again in each of its processes (collection: 12 s instead of 4.7 s). An empty
# value is "unset".
KEEP_BYTECODE = PYTHONDONTWRITEBYTECODE=

venv:
	scripts/ensure-venv

# The pytest configuration starts its own throwaway PostgreSQL server
# (tests/pg_cluster.py), so nothing has to be running beforehand.
# Then the few tests marked `alone`, which hold a figure of wall-clock time (lateness
# in ms), run by themselves in one process: beside three busy test processes on two cores
# their figure measures the machine's load, not the library (a p99 of 1.5-4 ms alone
# reached 48 ms once under the full suite). Exit status 5 is pytest's "no test selected",
# when PYTEST_ARGS names tests none of which is marked.
test:
	scripts/ensure-system-deps
	scripts/ensure-venv
	$(KEEP_BYTECODE) .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not alone" $(PYTEST_ARGS); \
	first=$$?; \
	$(KEEP_BYTECODE) .venv/bin/python -m pytest -p no:xdist -m alone $(PYTEST_ARGS); \
	second=$$?; [ $$second -eq 5 ] && second=0; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

# Retake the screenshots that the README and docs/ show (docs/screenshots/): the browser
# tests marked docs_screenshot, with --docs-screenshots. `make test` saves every screenshot
# in test-results/ only, so a test run never rewrites committed files.
screenshots:
	scripts/ensure-system-deps
	scripts/ensure-venv
	$(KEEP_BYTECODE) .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m docs_screenshot --docs-screenshots $(PYTEST_ARGS)

lint: venv
	.venv/bin/ruff check flask_defer tests demo_app
	.venv/bin/mypy --strict flask_defer
	.venv/bin/lint-imports

# The documentation: Sphinx with MyST over docs/, the API reference from the docstrings,
# the configuration page from config.DEFAULTS; any warning fails the build.
docs: venv
	.venv/bin/python -m sphinx -W --keep-going -b html -q docs docs/_build/html

demo: venv
	.venv/bin/python -m demo_app

bench:
	scripts/ensure-system-deps
	scripts/ensure-venv
	.venv/bin/pip install -e '.[bench]'
	.venv/bin/python -m bench

# Re-extract the blueprint's strings, merge them into the German and French
# catalogues (flask_defer/translations/), and compile the .mo files the wheel ships.
translations: venv
	.venv/bin/pybabel extract -F babel.cfg -k defer_gettext -k defer_ngettext:1,2 -k defer_pgettext:1c,2 -k N_ -k t -k gettext -k ngettext:1,2 \
		--no-location --project flask-defer --copyright-holder "flask_defer developers" \
		-o flask_defer/translations/flask_defer.pot .
	.venv/bin/pybabel update -D flask_defer -i flask_defer/translations/flask_defer.pot \
		-d flask_defer/translations --no-fuzzy-matching
	.venv/bin/pybabel compile -D flask_defer -d flask_defer/translations --statistics
