"""mapsat calibrate: fit a system file's kernel times (and network levels) to measurements."""

from __future__ import annotations

from pathlib import Path

import click

from costmodel.calibration import calibrate_system
from costmodel.errors import InputError
from costmodel.load import ensure_parent
from solver.cli.options import user_errors


def _nccl_pairs(values: tuple[str, ...]) -> dict[str, Path]:
    pairs = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--nccl {value}: expected NETWORK=FILE, e.g. nvlink=all_reduce_perf.txt")
        if name in pairs:
            raise InputError(f"--nccl {value}: network {name!r} is given twice")
        pairs[name] = Path(path)
    return pairs


@click.command("calibrate")
@click.option("--base", "base_path", required=True, type=click.Path(dir_okay=False),
              help="System file with '# mapsat-calibrate: ...' markers where fitted fields go.")
@click.option("--measurements", "measurements", required=True, type=click.Path(file_okay=False),
              help="Folder of microbenchmark JSON (gemm.json, attention.json, eltwise.json, adam.json, host.json).")
@click.option("--nccl", "nccl", multiple=True, metavar="NETWORK=FILE",
              help="nccl-tests output for the network of that name (repeatable).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Write the calibrated system file here (default: print it).")
@user_errors
def command(base_path, measurements, nccl, out_path):
    """Fit a system file's kernel times (and network levels) to measurements.

    Fits GEMM, fused-attention and HBM kernel times (and network efficiency and latency from
    nccl-tests) and writes them into a system file; prints each family's error where fitted
    and on held-out points.

    \b
    Example:
      mapsat calibrate --base problems/systems/calibration/h100-80g-nvl8.base.yaml \\
        --measurements problems/measurements/h100-sxm-80g --out problems/systems/h100-80g-nvl8.yaml
    """
    if not Path(measurements).is_dir():
        raise InputError(f"--measurements {measurements}: no such folder")
    result = calibrate_system(Path(base_path), Path(measurements), _nccl_pairs(nccl))
    if out_path is None:
        click.echo(result.text, nl=False)
    else:
        ensure_parent(out_path, "--out").write_text(result.text, encoding="utf-8")
    seen = set()
    for f in result.fits:
        if f.family in seen:
            continue
        seen.add(f.family)
        held_out = f"; held out ({f.test_points}): {f.test.text()}" if f.test.count else ""
        fitted = f"fitted ({f.fit_points}): {f.fit.text()}" if f.fit.count else "not fitted"
        click.echo(f"{f.family}: {fitted}{held_out}", err=out_path is None)
    for note in result.notes:
        click.echo(note, err=out_path is None)
