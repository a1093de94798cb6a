"""Running an operation written once as a generator, by a sync or an awaited sender.

An operation (token batching's ledger, a split limit's two choices) yields
what it needs sent, is sent each answer, and returns its own. The sync
classes run it with ``run``, the asyncio ones with ``arun``; the operation
itself never does I/O, so the rules are not written twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import TypeVar

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")


def run(steps: Generator[S, R, T], send: Callable[[S], R]) -> T:
    """Drive ``steps`` to its end, sending each request with ``send``."""
    try:
        request = next(steps)
        while True:
            request = steps.send(send(request))
    except StopIteration as done:
        answer: T = done.value
        return answer
    finally:
        # A send that raised leaves the operation suspended: end it, so nothing runs it later.
        steps.close()


async def arun(steps: Generator[S, R, T], send: Callable[[S], Awaitable[R]]) -> T:
    """Drive ``steps`` to its end, awaiting each request sent with ``send``."""
    try:
        request = next(steps)
        while True:
            request = steps.send(await send(request))
    except StopIteration as done:
        answer: T = done.value
        return answer
    finally:
        steps.close()
