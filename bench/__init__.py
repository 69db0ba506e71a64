"""Measurements of flask_defer (not tests): run a module with ``python -m bench.<name>``."""
