"""Errors a user can cause, each carrying a one-line message naming the culprit."""

from typing import Any


class MapsatError(Exception):
    """Base for every error that is the user's input, not a bug: the CLI prints its one-line
    message and exits with status 1, without a traceback."""


class InputError(MapsatError):
    """A file or value the user supplied is malformed or inconsistent."""


class InternalError(MapsatError):
    """A bug, not the user's input (e.g. CP-SAT rejecting the model it was given): still one
    line and exit status 1, the message saying what failed so it can be reported."""


def shown(value: Any, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut short if long (a list of 100,000 layer
    indices is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
