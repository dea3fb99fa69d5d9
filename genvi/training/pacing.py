"""How often `gv.fit` looks up from its compiled loop: the pace, in steps, of its
calls, between which it reads stop requests (genvi/training/signals.py).

A compiled call cannot be interrupted, so a chunk longer than the pace is cut into
calls of `pace` steps, about `PACE_SECONDS` each: the pace starts at one step (the
first call also compiles), grows at most `GROWTH`-fold at each look, and settles
where a call takes about `PACE_SECONDS` by the time its steps took (a short call's
fixed cost makes its steps look slower than they are, so the estimate errs towards
short calls). A chunk shorter than the pace is one call. A run's result does not
depend on how its steps are cut into calls (genvi/training/fit_loop.py), so pacing
changes no number.

One process looks after every call. Several processes look when the steps since the
last look reach the pace (the same call on each: the steps and the pace are the
same) and agree there in one small collective: a signal on any process stops all, at
the least pace proposed, so that they stop at the same step and write one checkpoint.

Example:
    >>> from genvi.training.pacing import Pacer
    >>> pacer = Pacer()
    >>> pacer.call_length(0, 1000)   # the first call: one step
    1
    >>> pacer.look(1, 2.5, signal=0)   # it took 2.5 s (compiling); no signal: go on
    0
"""

from __future__ import annotations

from typing import Callable

# the seconds between two looks at stop requests, where the steps allow it: a Ctrl-C
# or a scheduler's SIGTERM is honoured about this long after it arrives
PACE_SECONDS = 0.5
# the most a pace grows at one look: from one step to a chunk of 1,000 in four calls
GROWTH = 16


class Pacer:
    """Where the fit's compiled calls end and where it looks at stop requests.

    `agree(signal, pace) -> (signal, pace)` joins the processes' views at a look
    (`genvi.training.distributed.agreement`); without it, one process looks after
    every call. `seconds` is the wanted length of a call.

    Example:
        >>> from genvi.training.pacing import Pacer
        >>> pacer = Pacer()
        >>> pacer.look(1, 0.001, signal=0), pacer.pace   # 1 ms a step: 16 steps next
        (0, 16)
        >>> pacer.call_length(10, 12), pacer.expected_seconds(2)
        (2, 0.002)
    """

    def __init__(self, agree: Callable[[int, int], tuple[int, int]] | None = None,
                 seconds: float = PACE_SECONDS):
        self.every_call = agree is None
        self.agree = agree or (lambda signal, pace: (signal, pace))
        self.seconds = seconds
        self.pace = 1
        self.seconds_per_step: float | None = None
        self._steps, self._seconds = 0, 0.0   # since the last look

    def call_length(self, at: int, until: int) -> int:
        """The steps of the call starting at step `at` in a chunk ending at `until`."""
        return min(until - at, self.pace)

    def expected_seconds(self, steps: int) -> float | None:
        """How long `steps` steps should take (None before any was timed)."""
        return None if self.seconds_per_step is None else steps * self.seconds_per_step

    def look(self, steps: int, seconds: float, signal: int) -> int:
        """After a call of `steps` steps that took `seconds`, given the signal this
        process received (0: none): the signal that stops the fit here, on any
        process (0: go on). Several processes read it, and set the pace, only at a
        look; between looks the answer is 0, on every process alike."""
        self._steps += steps
        self._seconds += seconds
        if not self.every_call and self._steps < self.pace:
            return 0
        if self._steps:
            self.seconds_per_step = self._seconds / self._steps
            proposed = max(1, min(GROWTH * self.pace,
                                  int(self.seconds / self.seconds_per_step)))
        else:
            proposed = self.pace
        stop, self.pace = self.agree(signal, proposed)
        self._steps, self._seconds = 0, 0.0
        return stop
