"""How a study's driver stops on a signal: gracefully once, at once the second time, always resumable.

Ray Tune stops a run gracefully on SIGUSR1 (it saves the experiment state one
last time and ``Tuner.fit()`` returns normally), and by default also catches
one SIGINT in the same way, after which nothing tells the caller that the run
was cut short. The driver therefore takes SIGINT, SIGTERM and SIGHUP itself
(``StopSignals``), with Ray Tune's own SIGINT handler turned off
(``TUNE_DISABLE_SIGINT_HANDLER``):

- the first signal while trials run asks Ray Tune to stop gracefully (SIGUSR1),
  and when ``fit()`` returns, ``StudyInterrupted`` is raised instead of going on
  to the end of the study;
- the first signal at any other moment, or a second signal, raises
  ``StudyInterrupted`` at once.

``StudyInterrupted`` is a ``KeyboardInterrupt``: ``records.stopped_on_failure``
marks the study's MLflow runs KILLED with the signal's name, Optuna's running
trials stay RUNNING for ``--resume`` to continue, and the driver exits with
128 + the signal number, as a shell reports a process killed by that signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TUNE_FLAG = "TUNE_DISABLE_SIGINT_HANDLER"  # Ray Tune reads it when fit() starts


class StudyInterrupted(KeyboardInterrupt):
    """The driver was asked to stop by ``signum``; the study's state is saved for ``--resume``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_INSTALLED: list[StopSignals] = []  # the StopSignals whose handlers are installed (main thread), innermost last


def _signum(error: KeyboardInterrupt) -> int:
    """The signal behind ``error``: ``StudyInterrupted``'s; for a plain KeyboardInterrupt the signal the installed
    handlers received (a library that catches the handler's ``StudyInterrupted`` may raise its own KeyboardInterrupt:
    Ray's waits did, so a SIGTERM to study.final's seeds read as a SIGINT), else SIGINT."""
    if isinstance(error, StudyInterrupted):
        return error.signum
    received = _INSTALLED[-1].received if _INSTALLED else None
    return received or signal.SIGINT


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A write that a signal must not cut in half: the innermost installed ``StopSignals`` defers its first signal to
    the end of the block (``StopSignals.deferred``); with none installed, the body runs as it is.

    An exception raised by a handler inside an MLflow sqlite commit leaves the cut transaction holding the store's
    write lock, and every write after it (the runs' KILLED marks) fails with "database is locked".
    """
    if not _INSTALLED:
        yield
        return
    with _INSTALLED[-1].deferred():
        yield


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A wait between writes (for a server that went away): a signal stops it at once, also one that an enclosing
    ``uninterrupted`` block has deferred so far."""
    if not _INSTALLED:
        yield
        return
    stops = _INSTALLED[-1]
    stops.check()
    with stops.at("anywhere"):
        yield


def signal_name(error: KeyboardInterrupt) -> str:
    """The signal that stopped the driver (``_signum``)."""
    return signal.Signals(_signum(error)).name


def exit_code(error: KeyboardInterrupt) -> int:
    """128 + the signal number (``_signum``; 130 for a plain Ctrl-C)."""
    return 128 + _signum(error)


@contextlib.contextmanager
def env_set(key: str, value: str) -> Iterator[None]:
    """The environment variable ``key`` is ``value`` for the block, then as it was (Ray Tune reads its flags there
    when ``fit()`` starts)."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP handlers for the length of a study (main thread only).

    What the first signal does depends on the moment: inside ``graceful()`` it stops Ray Tune gracefully,
    inside ``deferred()`` it waits for the end of the block, anywhere else it raises ``StudyInterrupted``.
    A second signal always raises at once.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.moment = "anywhere"  # or "fitting", "deferred"

    def handle(self, signum: int, frame) -> None:
        first = self.received is None
        self.received = self.received or signum
        tune_listens = signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        if first and self.moment == "fitting" and tune_listens:
            signal.raise_signal(signal.SIGUSR1)  # Ray Tune's graceful stop: it saves its state and fit() returns
        elif not (first and self.moment == "deferred"):
            raise StudyInterrupted(self.received)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """The handlers, installed for the body and restored after it; Ray Tune's own SIGINT handler is off meanwhile."""
        with env_set(TUNE_FLAG, "1"):
            previous = {s: signal.signal(s, self.handle) for s in HANDLED}
            _INSTALLED.append(self)
            try:
                yield self
            except KeyboardInterrupt as error:  # leaves as the signal that stopped it (``_signum``)
                if isinstance(error, StudyInterrupted) or self.received is None:
                    raise
                raise StudyInterrupted(self.received) from error
            finally:
                _INSTALLED.remove(self)
                for s, handler in previous.items():
                    signal.signal(s, handler)

    @contextlib.contextmanager
    def at(self, moment: str) -> Iterator[None]:
        """The body runs at ``moment``; a signal received in it raises ``StudyInterrupted`` when it ends."""
        before, self.moment = self.moment, moment
        try:
            yield
        finally:
            self.moment = before
        self.check()

    def graceful(self):
        """A ``Tuner.fit()`` in the body stops gracefully on the first signal; ``StudyInterrupted`` follows it."""
        return self.at("fitting")

    def deferred(self):
        """A body that must not be cut in half (creating a study's records): the first signal waits for its end."""
        return self.at("deferred")

    def check(self) -> None:
        """Raises ``StudyInterrupted`` when a signal arrived."""
        if self.received is not None:
            raise StudyInterrupted(self.received)
