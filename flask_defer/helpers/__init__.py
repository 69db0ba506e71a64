"""Plugins built on the per-app state: they never import ``Defer``."""
