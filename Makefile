# Common developer tasks. Every target installs what it needs first, so a
# fresh checkout on Debian only needs `make test`.

PYTEST_ARGS ?=

.PHONY: venv test lint demo bench

venv:
	scripts/ensure-venv

# The pytest configuration starts its own throwaway PostgreSQL server
# (tests/pg_cluster.py), so nothing has to be running beforehand.
test:
	scripts/ensure-system-deps
	scripts/ensure-venv
	.venv/bin/python -m pytest $(PYTEST_ARGS)

lint: venv
	.venv/bin/ruff check flask_defer tests demo_app
	.venv/bin/mypy --strict flask_defer
	.venv/bin/lint-imports

demo: venv
	.venv/bin/python -m demo_app

bench:
	scripts/ensure-system-deps
	scripts/ensure-venv
	.venv/bin/pip install -e '.[bench]'
	.venv/bin/python -m bench
