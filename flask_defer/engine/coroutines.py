"""Running a coroutine handler to completion from synchronous code (``run_due``).

The worker awaits ``async def`` handlers on its event loop (:mod:`.event_loop`);
``run_due`` runs in the caller's thread, which may be plain synchronous code or may
already run an event loop of its own (async code calling ``run_due``, a notebook,
Playwright's sync API), where a second loop cannot run.

And, for the worker's event loop, awaiting a handler under its timeout and its abort
request (:func:`awaited`).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Coroutine
from typing import Any

from ..jobs import ABORT_CHECK_SECONDS, ABORTS, Job


def run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine handler to completion from synchronous code, on a loop of its own.

    When this thread already runs an event loop (``run_due`` called from async code, a
    notebook, Playwright's sync API), a second loop cannot run in it: the coroutine then
    runs on a loop of its own in a helper thread, with this thread's context (the app
    context) copied, and this thread waits for it.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _on_a_new_loop(coroutine)
    answer: dict[str, Any] = {}

    def run() -> None:
        try:
            answer["value"] = _on_a_new_loop(coroutine)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller
            answer["error"] = error

    context = contextvars.copy_context()
    helper = threading.Thread(target=context.run, args=(run,), name="flask-defer-run-due-loop")
    helper.start()
    helper.join()
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


def _on_a_new_loop(coroutine: Coroutine[Any, Any, Any]) -> Any:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


class HandlerTimeout(Exception):
    """A handler ran longer than its timeout; recorded as the attempt's error."""


class AbortedTask(Exception):
    """Internal: a coroutine handler was cancelled because its abort was requested."""


async def awaited(job: Job, work: Any, timeout: float | None) -> Any:
    """Await a coroutine handler, cancelling it past *timeout* seconds
    (:class:`HandlerTimeout`) or once its abort is requested (:class:`AbortedTask`).

    The handler runs as a task of its own, looked at every ``ABORT_CHECK_SECONDS``: the
    request itself reaches this process through the heartbeat (``engine.leases``).
    """
    task = asyncio.ensure_future(work)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            wait = ABORT_CHECK_SECONDS
            if deadline is not None:
                wait = min(wait, max(deadline - time.monotonic(), 0.0))
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            if ABORTS.requested(job.id, job.claim_token):
                task.cancel()
                await asyncio.wait({task})
                if task.cancelled():
                    raise AbortedTask()
                return task.result()  # it finished (or failed) before the cancel landed
            if deadline is not None and time.monotonic() >= deadline:
                task.cancel()
                await asyncio.wait({task})
                raise HandlerTimeout(f"handler ran longer than its timeout of {timeout:g} s")
    finally:
        if not task.done():
            task.cancel()  # the worker is stopping (this coroutine was cancelled)
