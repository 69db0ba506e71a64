"""The groups of ``Defer``'s public methods, one concern a module, mixed into ``Defer``.

:class:`~flask_defer.Defer` is the one facade every caller uses; its methods are many,
so they are written here by concern and ``Defer`` inherits them all: the Undo UI
(:mod:`.undo`), schema revisions (:mod:`.schema`), recurring schedules
(:mod:`.recurring`), the built-in helpers (:mod:`.helpers`), the operator dashboard
(:mod:`.dashboard`) and paused queues and job names (:mod:`.pauses`). Each method is as
thin as those in ``extension.py``: it checks its arguments and hands the current app's
state to the module that owns the rule.
"""
