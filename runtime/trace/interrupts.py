"""Interrupts (Ctrl-C) that arrive while a trace installs or removes its instruments are deferred.

Opening a trace, putting its wrappers, swaps and registry entries on, taking them off again and
closing it are many small steps: a KeyboardInterrupt between two of them would leave half a
change behind (a swapped ``torch.dropout`` nobody restores, a config still pointing at a routing
function, a lock still held). Python runs signal handlers only in the main thread, between two
bytecodes of whatever frame runs there. So while a trace is open in the main thread, the Python
handler of every signal that has one (SIGINT's ``default_int_handler``, a SIGALRM timer's …) is
wrapped by :func:`_handler`, which looks at the frame the signal landed in:

- inside a *critical* frame (``Tracer.__enter__``, ``Tracer.__exit__`` and whatever they call),
  the signal is recorded and handed to the original handler when the critical section ends
  (:func:`deliver`: before the forward starts, and when the trace is closed);
- inside an *open* frame below one (``Tracer._forward``: the model's own forward, which may be
  long) or anywhere else (the trace's body), the original handler runs at once, and the trace's
  ``finally`` takes everything away (itself critical, so not interrupted).

The wrappers are put on when the first trace of the main thread opens and the original handlers
put back when the last one closes: between traces nothing of nnatlas' is installed. While
several are put back the signals are held at the OS (POSIX), so that none reaches a handler half
way; what was deferred goes to the original handlers then. One wrapped signal (SIGINT alone, the
usual case) is put back in one step, with nothing to hold: one that lands after it reaches its
original handler at once, and what was deferred before goes with it when that handler raises (the
first that raises ends it, as in :func:`deliver`). A trace in another thread needs none of this (no
handler runs there). Cost: one ``sigaction`` per wrapped signal each way, and two ``sigprocmask``
where several are wrapped; after a forward has pushed this code out of the caches, each of those
system calls is a few microseconds (bench: the fixed cost of a trace).
"""

from __future__ import annotations

import _signal  # the C module under ``signal``: no enum conversions (0.01 µs a lookup, not 2 µs)
import signal
import threading
from types import CodeType, FrameType
from typing import Any

# Ctrl-C, a termination request turned into an exception, and a timer's alarm (what a test, a
# timeout or a notebook's interrupt uses); each is wrapped only when it has a Python handler
SIGNALS = tuple(int(getattr(signal, n)) for n in ("SIGINT", "SIGTERM", "SIGALRM") if hasattr(signal, n))
_MAIN = threading.main_thread().ident
_get_ident = threading.get_ident
_getsignal = _signal.getsignal
_MASK = getattr(_signal, "pthread_sigmask", None)  # (POSIX: the process's signals held while handlers change)

CRITICAL: set[CodeType] = set()  # a signal landing in one of these frames (or below) waits
OPEN: set[CodeType] = set()  # ... unless an open frame comes first, walking up from where it landed

_depth = 0  # traces open in the main thread
_saved: dict[int, Any] = {}  # signal -> the handler that was there before ours
_pending: list[tuple[int, FrameType | None]] = []  # deferred signals, with the frame each landed in


def critical(fn: Any) -> Any:
    """Decorator: ``fn``'s frames (and the frames it calls, up to an :func:`open_frame`) defer signals."""
    CRITICAL.add(fn.__code__)
    return fn


def open_frame(fn: Any) -> Any:
    """Decorator: below a critical frame, ``fn``'s frames take signals at once again (the forward)."""
    OPEN.add(fn.__code__)
    return fn


def _handler(signum: int, frame: FrameType | None) -> Any:
    f = frame
    while f is not None:
        code = f.f_code
        if code in OPEN:
            break
        if code in CRITICAL:
            _pending.append((signum, frame))
            return None
        f = f.f_back
    original = _saved.get(signum)
    if callable(original):
        return original(signum, frame)
    return None


CRITICAL.add(_handler.__code__)  # a signal that lands while the handler itself runs waits too


@critical
def enter() -> bool:
    """Called first thing when a trace opens: in the main thread, wrap the signals' handlers (once
    for nested traces). Returns whether this call counted (pass it to :func:`leave`)."""
    global _depth
    if _get_ident() != _MAIN:
        return False
    if not _depth:
        try:
            for sig, current in zip(SIGNALS, map(_getsignal, SIGNALS)):
                if current is not _handler and callable(current):
                    _saved[sig] = current
                    _signal.signal(sig, _handler)
        except BaseException:
            _restore()
            _saved.clear()
            raise
    _depth += 1
    return True


def _restore() -> None:
    """Put the original handlers back (``_saved`` keeps them: the caller clears it once what was deferred is
    delivered to them)."""
    for sig, original in _saved.items():
        if _getsignal(sig) is _handler:
            _signal.signal(sig, original)


@critical
def leave(counted: bool) -> None:
    """Called last thing when a trace closes: put the original handlers back when no trace is
    open any more, then deliver what was deferred meanwhile (the original handler raises
    KeyboardInterrupt for SIGINT)."""
    global _depth
    if not counted:
        return
    _depth -= 1
    if _depth > 0:  # an outer trace is still open: its handlers stay wrapped
        deliver()
        return
    if not _saved and not _pending:  # no signal had a Python handler to wrap: nothing to put back
        return
    # (one handler goes back in one step: no bytecode runs between its sigaction and its entry in Python's
    # table, so no signal can find it half way)
    held = _hold() if len(_saved) > 1 else None
    try:
        _restore()
        # what was deferred, including a signal that landed while the handlers were put back (this
        # frame is critical: it waited), goes to the original handlers, before any signal held meanwhile
        if _pending:
            _call(_take(), _saved)
    except BaseException:
        # an original handler raised (the one a signal reached right after it was put back, or a deferred
        # one's): what is still deferred goes with that exception, not to a later trace
        del _pending[:]
        raise
    finally:
        _saved.clear()
        if held is not None:  # (_release, inlined)
            _MASK(_signal.SIG_SETMASK, held)  # type: ignore[misc]


def _hold() -> Any:
    """Hold the wrapped signals at the OS while the handlers change (POSIX), so that none reaches
    a handler half way; returns the mask to put back (None where signals cannot be held). One
    that arrived just before runs its (wrapped) handler at once, here, and is deferred."""
    if _MASK is None:
        return None
    return _MASK(_signal.SIG_BLOCK, SIGNALS)


def _release(held: Any) -> None:
    """Let the held signals through again: each reaches its original handler now."""
    if held is not None:
        _MASK(_signal.SIG_SETMASK, held)  # type: ignore[misc]


def pending() -> bool:
    return bool(_pending)


def _take() -> list[tuple[int, FrameType | None]]:
    batch = _pending[:]
    del _pending[:]
    return batch


@critical
def deliver() -> None:
    """Hand the deferred signals to their original handlers now, in the order they came (the first
    that raises ends it: several Ctrl-C in one critical section are one KeyboardInterrupt)."""
    if _pending:
        _call(_take(), _saved)


@critical
def _call(batch: list[tuple[int, FrameType | None]], handlers: dict[int, Any]) -> None:
    for signum, frame in batch:
        original = handlers.get(signum)
        if callable(original):
            original(signum, frame)


def installed() -> bool:
    """Whether nnatlas' handler is on any signal now (never, outside a trace)."""
    return any(_signal.getsignal(sig) is _handler for sig in SIGNALS)
