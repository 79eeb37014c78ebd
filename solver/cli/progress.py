"""What a long command is doing, on stderr: a transient spinner on a terminal, plain
`progress: ...` lines anywhere else (a pipe, a file, `--json` read by a program), once the
work has taken PROGRESS_AFTER_S; nothing with `--quiet`. stdout stays the answer alone."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, Iterator

import click

PROGRESS_AFTER_S = 2.0
"""Seconds of work before the first word of progress: a command that answers sooner says nothing."""


def quiet() -> bool:
    """Whether the running command got --quiet."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and (ctx.meta.get("mapsat.quiet") or ctx.params.get("quiet")))


@contextlib.contextmanager
def progress_line(enabled: bool | None = None) -> Iterator[Callable[[str], None]]:
    """Yields `say(text)`: what the work is doing now. Shown on stderr once the work has taken
    PROGRESS_AFTER_S (a spinner on a terminal, else a line per new text); `enabled` False, or
    the command's --quiet when `enabled` is None, shows nothing."""
    if enabled is None:
        enabled = not quiet()
    if not enabled:
        yield lambda text: None
        return
    from rich.console import Console   # (only when something may be shown)

    console = Console(stderr=True)
    show, say, stop = _spinner(console) if console.is_terminal else _plain_lines()
    timer = threading.Timer(PROGRESS_AFTER_S, show)
    timer.daemon = True
    if PROGRESS_AFTER_S <= 0:
        show()                          # (at once: nothing to wait for)
    else:
        timer.start()
    try:
        yield say
    finally:
        timer.cancel()
        stop()


def _spinner(console) -> tuple[Callable[[], None], Callable[[str], None], Callable[[], None]]:
    """A transient rich status line: (show, say, stop)."""
    state = {"text": "working", "status": None}
    lock = threading.Lock()

    def show() -> None:
        with lock:
            if state["status"] is None and state["text"] is not None:
                state["status"] = console.status(state["text"])
                state["status"].start()

    def say(text: str) -> None:
        with lock:
            state["text"] = text
            if state["status"] is not None:
                state["status"].update(text)

    def stop() -> None:
        with lock:
            state["text"] = None
            if state["status"] is not None:
                state["status"].stop()

    return show, say, stop


def _plain_lines() -> tuple[Callable[[], None], Callable[[str], None], Callable[[], None]]:
    """`progress: text` lines on stderr, each new text once, from the moment `show` is called:
    (show, say, stop)."""
    state = {"text": "working", "shown": None, "on": False}
    lock = threading.Lock()

    def write() -> None:
        if state["on"] and state["text"] != state["shown"]:
            sys.stderr.write(f"progress: {state['text']}\n")
            sys.stderr.flush()
            state["shown"] = state["text"]

    def show() -> None:
        with lock:
            state["on"] = True
            write()

    def say(text: str) -> None:
        with lock:
            state["text"] = text
            write()

    def stop() -> None:
        with lock:
            state["on"] = False

    return show, say, stop
