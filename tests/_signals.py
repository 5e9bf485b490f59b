"""Signal dispositions for tests that send signals: the defaults, whatever the test run
inherited (a run started in the background ignores SIGINT, one under ``nohup`` SIGHUP; a child,
or a check of the handlers, would then see the inherited ``SIG_IGN``)."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def defaults():
    """SIGTERM and SIGHUP with their default dispositions, and SIGINT raising
    ``KeyboardInterrupt``, in this process for the duration (children started meanwhile inherit
    the defaults); the previous ones after."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
