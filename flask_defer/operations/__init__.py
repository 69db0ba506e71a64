"""The rules, each said once, over one app's state: what scheduling, control and reads do.

The facade's methods check only what their public signature knows and hand the current
app's :class:`~.state.DeferState` (a plain holder, built complete by
:func:`~.assembly.build_state`) to these functions:

* :mod:`.scheduling`: ``schedule``, ``schedule_many``, ``undoable`` and the one
  insert-and-signal path, with the :class:`~.scheduling.ScheduleOptions` every
  scheduling call relays;
* :mod:`.control`: cancel, undo (and its hooks), hold, reschedule, retry: guarded
  statements, and what a refused one means;
* :mod:`.reads`: jobs, history, toasts, the health report;
* :mod:`.running`: ``run_due``, a worker, pruning;
* :mod:`.bulk` (checking many jobs at once), :mod:`.health` (the report's figures) and
  :mod:`.metrics` (Prometheus).
"""
