"""Signals during `gv.fit` are requests: SIGINT (Ctrl-C) and SIGTERM (a scheduler's
preemption) set a flag that the fit reads between compiled calls, so no signal ever
raises inside a checkpoint write or anywhere else the fit does not expect it.

`StopRequests` installs the handlers for the fit's duration (on the main thread only:
Python runs signal handlers there alone) and restores the previous ones when the fit
returns or raises. A signal that the process ignores (`SIG_IGN`, as in a shell's
background job) stays ignored, and one handled outside Python (by a C extension) is
left to that handler. A second signal while the fit is stopping may cut short
the wait for the compiled steps under way (`abandonable`): it raises `StopNow` there
and nowhere else, never in a write.

Example:
    >>> import os, signal
    >>> from genvi.training.signals import StopRequests
    >>> with StopRequests() as requests:
    ...     os.kill(os.getpid(), signal.SIGTERM)   # a scheduler's preemption
    ...     requests.stopping
    True
    >>> requests.describe(300, 1000)
    'terminated (SIGTERM) after step 300; 700 of the 1000 steps asked for were not run'
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import threading
from typing import Any, Iterator

import jax

# a wait expected to be shorter than this blocks at once (no helper thread): a second
# signal would gain little by cutting it short
BLOCK_BELOW_SECONDS = 0.05

# the signals a fit listens to, and how its `stopped` names each
LISTENED = {signal.SIGINT: "interrupted (Ctrl-C)",
            signal.SIGTERM: "terminated (SIGTERM)"}


class StopNow(Exception):
    """A second signal while waiting for compiled steps: stop without their result."""


class StopRequests:
    """The fit's stop requests: `stopping` once SIGINT or SIGTERM arrived (the first
    one's name is in `describe`), restoring the previous handlers on exit.

    `listen=False`, or a fit off the main thread, installs nothing (a signal then
    reaches whatever handles it in the program, as without genvi).

    Example:
        >>> from genvi.training.signals import StopRequests
        >>> with StopRequests(listen=False) as requests:
        ...     requests.stopping, requests.listening
        (False, False)
    """

    def __init__(self, listen: bool = True):
        self.listening = listen and threading.current_thread() is threading.main_thread()
        self.first: signal.Signals | None = None   # the first signal
        self.elsewhere = False          # it reached another process of the fit
        self._previous: dict[int, Any] = {}
        self._abandonable = False

    @property
    def stopping(self) -> bool:
        """Whether a signal asked the fit to stop."""
        return self.first is not None

    @property
    def number(self) -> int:
        """The signal that asked for a stop, 0 if none did."""
        return 0 if self.first is None else int(self.first)

    def agreed(self, number: int) -> bool:
        """Take the processes' agreement (a signal's number; 0: none): whether to stop."""
        if number and self.first is None:
            self.first, self.elsewhere = signal.Signals(number), True
        return bool(number)

    def describe(self, reached: int, end: int, base: int = 0) -> str:
        """The fit's `stopped` when a signal ended it after step `reached` of `base .. end`."""
        assert self.first is not None  # asked once a signal stopped the fit
        where = " on another process of the fit," if self.elsewhere else ""
        return (f"{LISTENED[self.first]}{where} after step {reached}; {end - reached} of "
                f"the {end - base} steps asked for were not run")

    def __enter__(self) -> "StopRequests":
        if self.listening:
            for number in LISTENED:
                previous = signal.getsignal(number)
                # ignored on purpose, or handled outside Python (which Python could not
                # set back afterwards): leave it so
                if previous is signal.SIG_IGN or previous is None:
                    continue
                self._previous[number] = previous
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        # a fit inside another's callback: the request stops the outer fit too
        # (no signal: first is None, and so is its previous handler; mypy wants an int key)
        outer: Any = self._previous.get(self.first)  # type: ignore[arg-type]
        if self.first is not None and not self.elsewhere and isinstance(
                getattr(outer, "__self__", None), StopRequests):
            outer.__self__.first = outer.__self__.first or self.first
        self._previous.clear()

    def _handle(self, number: int, frame: Any) -> None:
        if self.first is None:
            self.first = signal.Signals(number)
        elif self._abandonable:
            self._abandonable = False
            raise StopNow

    @contextlib.contextmanager
    def abandonable(self) -> Iterator[None]:
        """A region (waiting for compiled steps) that a second signal may end with
        `StopNow`; outside one, signals only set the flag.

        Example:
            >>> from genvi.training.signals import StopRequests
            >>> with StopRequests(listen=False) as requests, requests.abandonable():
            ...     pass
        """
        self._abandonable = self.listening
        try:
            yield
        finally:
            self._abandonable = False

    def wait_for(self, outputs: Any, expected_seconds: float | None,
                 abandonable: bool = True) -> Any:
        """`outputs` (compiled steps under way), ready to read. A wait of unknown or long
        expected length (`expected_seconds`) happens on a helper thread, so that a
        second signal can end it with `StopNow` (the steps go on running, unread):
        a blocked main thread would run the handler only once they end.
        `abandonable=False` (a fit of several processes, which must all run the same
        steps) and a short wait return `outputs` at once; reading them waits.

        Example:
            >>> import jax.numpy as jnp
            >>> from genvi.training.signals import StopRequests
            >>> with StopRequests(listen=False) as requests:
            ...     float(requests.wait_for(jnp.float32(2.0), None))
            2.0
        """
        if not (self.listening and abandonable) or (
                expected_seconds is not None and expected_seconds < BLOCK_BELOW_SECONDS):
            return outputs   # the caller's first read of them waits (no cost added here)
        with self.abandonable():
            waiting = _waiter().submit(jax.block_until_ready, outputs)
            while True:   # timed waits: a signal delivered to another thread is still seen
                try:
                    return waiting.result(timeout=0.1)
                except concurrent.futures.TimeoutError:
                    continue


_WAITER: list = []


def _waiter() -> concurrent.futures.ThreadPoolExecutor:
    """The one helper thread that waits for compiled steps; it blocks the listened
    signals, so that the kernel delivers them to the main thread."""
    if not _WAITER:
        _WAITER.append(concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="genvi-wait",
            initializer=signal.pthread_sigmask, initargs=(signal.SIG_BLOCK, set(LISTENED))))
    return _WAITER[0]
