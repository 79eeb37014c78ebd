"""How a command fails: one line, a non-zero exit, no traceback (`mapsat --debug` shows it).

`one_line_errors` is the one place that turns what a user caused into that line: the
command group wraps every command's whole invocation in it (options' wrappers and
callbacks included), and `user_errors` (solver.cli.options) is the same for a single
command. Every line is cut to MAX_ERROR_LINE characters, so an input that echoes a long
value (a list of 100,000 layer indices) still reads as one short line. Light on purpose:
`mapsat --help` imports it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import click

from costmodel.errors import MapsatError

MAX_ERROR_LINE = 300
"""Characters in one error line, prefix included: the start names the file and field, the end
says why; the middle of a longer one (a long value) is cut."""
_CUT = " … "


def one_line(text: str, limit: int = MAX_ERROR_LINE) -> str:
    """`text` on one line (whitespace runs as one space), its middle cut to fit `limit`."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    tail_length = min(limit // 3, 100)
    head = text[:limit - tail_length - len(_CUT)]
    tail = text[-tail_length:]
    # cut between words where a word boundary is near
    head = head[:head.rfind(" ")] if head.rfind(" ") > len(head) - 20 else head
    tail = tail[tail.find(" ") + 1:] if 0 <= tail.find(" ") < 20 else tail
    return head + _CUT + tail


def debugging(ctx: click.Context | None = None) -> bool:
    """Whether `mapsat --debug` asked for tracebacks."""
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _fail(message: str) -> None:
    line = one_line(f"error: {message}")
    click.echo(line, err=True)
    sys.exit(1)


@contextlib.contextmanager
def one_line_errors(ctx: click.Context | None = None) -> Iterator[None]:
    """Errors the user caused as one line and exit 1 (unless --debug): MapsatError (bad input,
    an infeasible problem) and an OSError on a file the user named (a missing directory, a
    full disk, no permission). Ctrl-C that no command handled itself exits 130 with one line.
    click's usage errors (exit 2) keep their form, their message cut like the others."""
    try:
        yield
    except MapsatError as err:
        if debugging(ctx):
            raise
        _fail(str(err))
    except OSError as err:
        if debugging(ctx) or err.filename is None:
            raise
        _fail(f"{err.filename}: {err.strerror or err}")
    except click.ClickException as err:
        # "Error: Invalid value for '--gpus': " and the like come before the message
        err.message = one_line(err.message, MAX_ERROR_LINE - 60)
        raise
    except KeyboardInterrupt:
        if debugging(ctx):
            raise
        click.echo("interrupted (Ctrl-C)", err=True)
        sys.exit(130)
