"""The batchers' shared rules (``_ledger``), driven by hand: no server, a clock that is a number.

Tests with a server (test_batching.py, test_asyncio_batching.py) cannot make a
window end at an exact point of one call; here the replies are written out,
each the module's answer at that moment.
"""

from __future__ import annotations

from valkey_ratelimit._ledger import BatchOptions, Ledger, Refund, Take
from valkey_ratelimit.limiters import Window
from valkey_ratelimit.results import Result


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def window_reply(granted: int, remaining: int, reset_after_ms: int) -> Result:
    return Result(True, 10, remaining, 0, reset_after_ms, granted=granted)


def test_units_of_an_ended_window_are_not_spent_after_a_top_up() -> None:
    clock = Clock()
    options = BatchOptions(min_batch=5, max_batch=5, background=False, clock=clock, slack_ms=0)
    ledger = Ledger(Window(10, "1s"), options, "t")

    # t=0: a batch of 5 from the window that ends at t=1; one is spent, 4 are held.
    steps = ledger._acquire(1)
    assert next(steps) == Take(5, partial=True)
    try:
        steps.send(window_reply(5, 5, 1000))
    except StopIteration as done:
        assert done.value.allowed
    assert ledger.held == 4

    # t=0.9: a cost of 6 needs 2 more; the window has 1 left (PARTIAL gives it),
    # so the ledger asks for the last unit exactly.
    clock.now = 0.9
    steps = ledger._acquire(6)
    take = next(steps)
    assert take.partial
    top_up = steps.send(Result(True, 10, 0, 0, 100, granted=1))
    assert top_up == Take(1, partial=False)
    # The top-up is answered after the window ended (t=1): from the next window.
    clock.now = 1.05
    request: Take | Refund | None = None
    try:
        request = steps.send(Result(True, 10, 9, 0, 950))
        while True:  # a refund of the stale units would be too late: none is asked
            assert not isinstance(request, Refund), request
            request = steps.send(None)
    except StopIteration as done:
        answer = done.value
    # The 5 units held from the ended window may not be spent in the next one.
    assert not answer.allowed
    assert ledger.stats.admitted == 1
    assert ledger.held == 0
