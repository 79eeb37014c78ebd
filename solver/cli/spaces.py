"""`mapsat spaces`: the named mapping spaces and what each dimension means.
"""

from __future__ import annotations

import json

import click
from rich.table import Table

from solver.cli.options import user_errors, wide_console
from solver.space.declaration import DEFAULT_SPACE, SPACES, Space


def space_as_dict(space: Space) -> dict:
    """A space described for people and JSON: every dimension with domain, rule, meaning."""
    dims = [{"name": d.name, "domain": d.domain_text, "rule": d.rule_text, "meaning": d.meaning}
            for d in space.skeleton_dimensions()]
    dims += [{"name": d.name, "domain": d.domain_text(), "rule": d.rule_text(), "meaning": d.meaning}
             for d in space.flags]
    return {"name": space.name, "summary": space.summary, "tp_max": space.tp_max,
            "batch_is_dp_above_cap": space.batch_is_dp_above_cap,
            "default": space.name == DEFAULT_SPACE, "dimensions": dims}


@click.command(name="spaces")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@user_errors
def command(as_json: bool) -> None:
    """List the named mapping spaces and what each dimension means.

    A mapping space says which ways of splitting a model over N GPUs exist; `count`,
    `brute` and `solve` all read the same declaration.

    \b
    Example:
      mapsat spaces
      mapsat spaces --json
    """
    described = [space_as_dict(space) for space in SPACES.values()]
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    console = wide_console()
    for space in described:
        default = " (default)" if space["default"] else ""
        table = Table(title=f"{space['name']}{default}: {space['summary']}", title_justify="left")
        for header in ("dimension", "domain", "free / rule", "meaning"):
            table.add_column(header)
        for dim in space["dimensions"]:
            table.add_row(dim["name"], dim["domain"], dim["rule"], dim["meaning"])
        console.print(table)
