"""The one facade every caller uses: ``Defer``'s public methods, one concern a module.

Python code, the web blueprint and the CLI all call these methods, so a cancel from
the UI, from ``flask defer cancel`` and from a view is one code path with one set of
race rules. :class:`DeferFacade` gathers the groups: the core (:mod:`.core`: handlers,
scheduling, control, reads, running), the Undo UI (:mod:`.undo`), schema revisions
(:mod:`.schema`), recurring schedules (:mod:`.recurring`), the built-in features
(:mod:`.helpers`), the operator dashboard (:mod:`.dashboard`) and paused queues and
job names (:mod:`.pauses`), and workflows (:mod:`.workflow_methods`: groups, parents).
Each method is thin: it checks its arguments and hands the
current app's state to the module that owns the rule.

The facade stands below ``cli/`` and ``web/``, which reach it through
:func:`current_defer`; :class:`~flask_defer.Defer` (``extension.py``) adds the wiring
(``init_app``) above them, so registering the blueprint and the CLI group makes no
import circle.
"""

from __future__ import annotations

from ..operations.state import current_state
from .core_methods import CoreMethods
from .dashboard_methods import DashboardMethods
from .feature_methods import HelperMethods
from .pause_methods import PauseMethods
from .recurring_methods import RecurringMethods
from .schema_methods import SchemaMethods
from .undo_methods import UndoMethods
from .visibility_methods import VisibilityMethods
from .workflow_methods import WorkflowMethods

__all__ = ["DeferFacade", "current_defer"]


class DeferFacade(
    CoreMethods,
    UndoMethods,
    SchemaMethods,
    RecurringMethods,
    HelperMethods,
    DashboardMethods,
    PauseMethods,
    WorkflowMethods,
    VisibilityMethods,
):
    """Every public method of :class:`~flask_defer.Defer` but its wiring."""


def current_defer() -> DeferFacade:
    """The ``Defer`` bound to the current app: what the blueprint and the CLI call.

    Raises :class:`~flask_defer.NotConfigured` outside an app context or on an app
    that ``init_app`` was never called on.
    """
    extension = current_state().extension
    assert isinstance(extension, DeferFacade)
    return extension
