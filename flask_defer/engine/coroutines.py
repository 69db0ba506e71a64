"""Running a coroutine handler to completion from synchronous code (``run_due``).

The worker awaits ``async def`` handlers on its event loop (:mod:`.event_loop`);
``run_due`` runs in the caller's thread, which may be plain synchronous code or may
already run an event loop of its own (async code calling ``run_due``, a notebook,
Playwright's sync API), where a second loop cannot run.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Coroutine
from typing import Any


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
