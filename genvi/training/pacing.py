"""How often `gv.fit` looks up from its compiled loop: the pace, in steps, between the
points where it reads stop requests (genvi/training/signals.py).

A compiled call cannot be interrupted, so the fit cuts its chunks into calls of about
`PACE_SECONDS` each: the pace starts at one step (the first call also compiles), grows
at most `GROWTH`-fold at each look, and settles where a pace takes about
`PACE_SECONDS` by the time measured since the last look (a short call's per-call cost
makes its steps look slower than they are, so the estimate errs towards short calls). A run's result does not depend on how its
steps are cut into calls (genvi/training/fit_loop.py), so pacing changes no number.
Under several processes the processes look at the same steps and agree there (one
small collective: a signal on any process stops all, at the least pace proposed), so
that they stop at the same step and write one checkpoint.

Example:
    >>> from genvi.training.pacing import Pacer
    >>> pacer = Pacer(start=0)
    >>> pacer.call_length(0, 1000)   # the first call: one step
    1
    >>> pacer.look(1, signal=0)   # no stop request: go on
    0
"""

from __future__ import annotations

import time
from typing import Callable

# the seconds between two looks at stop requests, where the steps allow it: a Ctrl-C
# or a scheduler's SIGTERM is honoured about this long after it arrives
PACE_SECONDS = 0.5
# the most a pace grows at one look: from one step to a chunk of 1,000 in four calls
GROWTH = 16


class Pacer:
    """Where the fit's compiled calls end and where it looks at stop requests.

    `agree(signal, pace) -> (signal, pace)` joins the processes' views at a look
    (`genvi.training.distributed.agreement`; by default one process, which agrees
    with itself); `seconds` is the wanted time between looks.

    Example:
        >>> from genvi.training.pacing import Pacer
        >>> pacer = Pacer(start=10)
        >>> pacer.call_length(10, 12), pacer.expected_seconds(1)
        (1, None)
    """

    def __init__(self, start: int, agree: Callable[[int, int], tuple[int, int]] | None = None,
                 seconds: float = PACE_SECONDS):
        self.agree = agree or (lambda signal, pace: (signal, pace))
        self.seconds = seconds
        self.pace, self.next_look = 1, start + 1
        self.seconds_per_step: float | None = None
        self._since, self._since_step = time.perf_counter(), start

    def call_length(self, at: int, until: int) -> int:
        """The steps of the call starting at step `at` in a chunk ending at `until`."""
        return min(until, self.next_look) - at

    def expected_seconds(self, steps: int) -> float | None:
        """How long `steps` steps should take (None before any was timed)."""
        return None if self.seconds_per_step is None else steps * self.seconds_per_step

    def look(self, reached: int, signal: int) -> int:
        """After a call ending at step `reached`, given the signal this process
        received (0: none): the signal that stops the fit there, on any process (0: go
        on). Only at a look (`next_look`) is it read and the pace set; between looks
        the answer is 0, on every process alike."""
        if reached < self.next_look:
            return 0
        now = time.perf_counter()
        self.seconds_per_step = (now - self._since) / max(1, reached - self._since_step)
        proposed = max(1, min(GROWTH * self.pace, int(self.seconds / self.seconds_per_step)))
        stop, self.pace = self.agree(signal, proposed)
        self.next_look = reached + self.pace
        self._since, self._since_step = now, reached
        return stop
