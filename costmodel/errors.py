"""Errors a user can cause, each carrying a one-line message naming the culprit."""


class MapsatError(Exception):
    """Base for every error that is the user's input, not a bug: the CLI prints its one-line
    message and exits with status 1, without a traceback."""


class InputError(MapsatError):
    """A file or value the user supplied is malformed or inconsistent."""


class InternalError(MapsatError):
    """A bug, not the user's input (e.g. CP-SAT rejecting the model it was given): still one
    line and exit status 1, the message saying what failed so it can be reported."""
