"""The rules: what scheduling, control and reads do, over one app's state.

The facade's methods hand the current app's :mod:`.state` to these functions; the
store below runs their statements. Here the per-app state is built
(:mod:`.state`, :mod:`.databases`), bulk jobs are checked (:mod:`.bulk`), cancels,
undo and the other control calls decide (:mod:`.control`), reads answer
(:mod:`.reads`), and the health report (:mod:`.health`) and metrics
(:mod:`.metrics`) are made.
"""
