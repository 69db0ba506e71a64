"""The runtime: claim, execute and acknowledge jobs; no Flask, no web.

The engine is handed what it needs from above (an app-context factory, the store, the
config, a ticker for the recurring schedules) and imports nothing above itself. Its
modules, from the top:

* :mod:`.worker` (the long-running loop: wake, claim, hand out, flush, upkeep) and
  :mod:`.embedded` (one worker thread inside a development server);
* :mod:`.stopping` (graceful shutdown) and :mod:`.runner` (the one claim → execute →
  acknowledge loop of ``run_due``);
* :mod:`.pool` and :mod:`.event_loop` (where handlers run: threads, an asyncio loop),
  :mod:`.ack_flusher` (batched acknowledgements), :mod:`.maintenance` (reclaim and
  prune, one worker at a time), :mod:`.wake` (when to look again: LISTEN or poll),
  :mod:`.ticks` (when to tick the recurring schedules, through a Protocol);
* :mod:`.leases` (heartbeats that keep claims alive);
* :mod:`.execution` (one job's run: handler, timeout, outcome), :mod:`.outcomes`
  (what a run's result or exception means), :mod:`.retry` (backoff) and
  :mod:`.logs` (the worker's log lines);
* :mod:`.collector` (a worker process's start-up objects kept out of the garbage
  collector's full passes, which stop every thread).
"""
