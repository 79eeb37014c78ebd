"""mapsat calibrate: fit a system file's kernel times (and network levels) to measurements."""

from __future__ import annotations

from pathlib import Path

import click

from costmodel.calibration import calibrate_system
from costmodel.calibration.bands import out_of_sample_errors
from costmodel.calibration.step_fit import MAX_RUNS, STEP_PARAMETERS
from costmodel.calibration.step_render import calibrate_runs, summary_of
from costmodel.errors import InputError
from costmodel.inputs.load import ensure_parent
from costmodel.measured.error_bands import bands_of, write_bands
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_scoring import RunInputs
from solver.cli.options import user_errors, wide_console


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


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f} %"


SHIPPED_RUNS = tuple(Path(__file__).resolve().parents[2] / "problems" / "runs" / name
                     for name in ("megatron-bridge-pretraining.json", "h200-single-gpu-pytorch.json"))
"""The runs the shipped whole-step terms are fitted to: a user's runs extend them (docs/training-runs.md)."""


MAX_RUN_FILE_BYTES = 8_000_000
"""The largest run file read: 2.5 kB a Megatron-Bridge row, so room for 3,000 of them, more than
the fit takes (`MAX_RUNS`); checked before parsing, which for 100,000 runs takes minutes."""


def _run_files(runs: tuple[str, ...], with_shipped: bool) -> dict[str, tuple]:
    """Label → runs: the given files, and the shipped ones unless `with_shipped` is False; refused
    before parsing a file over `MAX_RUN_FILE_BYTES`, and past 10 × `MAX_RUNS` runs in all."""
    paths = [Path(path) for path in runs]
    if with_shipped:
        given = {path.resolve() for path in paths}
        paths = [path for path in SHIPPED_RUNS if path.resolve() not in given] + paths
    files, total = {}, 0
    for path in paths:
        size = path.stat().st_size if path.is_file() else 0
        if size > MAX_RUN_FILE_BYTES:
            raise InputError(f"--runs {path}: {size / 1e6:.1f} MB; calibrate reads run files of at most "
                             f"{MAX_RUN_FILE_BYTES / 1e6:.0f} MB (it fits at most {MAX_RUNS} runs): fit a sample")
        files[path.name] = tuple(read_runs(path))
        total += len(files[path.name])
        if total > 10 * MAX_RUNS:
            raise InputError(f"--runs: more than {10 * MAX_RUNS} runs in the files: the fit takes at most {MAX_RUNS}; "
                             "fit a sample of them")
    return files


def _print_fit(result, files: dict[str, tuple]) -> None:
    """Each run before and after and left out; the terms fitted (with standard errors) and held;
    each file's error before, after and left out."""
    fit, out = result.fit, wide_console()
    loco = {id(score.run): score for fold in result.loco for score in fold.scores}
    out.print(f"{'run':46} {'system':18} {'measured':>10}  {'time before':>11} {'after':>8} {'held out':>9}  "
              f"{'peak before':>11} {'after':>8}")
    for before, after in zip(fit.before, fit.after):
        run = before.run
        held = loco.get(id(run))
        out.print(f"{run.name:46} {after.system_name:18} {run.step_time_s:10.4g}  {_percent(before.time_error):>11} "
                  f"{_percent(after.time_error):>8} {_percent(held.time_error if held else None):>9}  "
                  f"{_percent(before.memory_error):>11} {_percent(after.memory_error):>8}")
    for name in fit.unusable:
        out.print(f"not used: {name} (infeasible in the model, or measured more than 10x off its prediction)")
    fitted = [f"{p.name} {getattr(fit.step, p.name):g} ± {fit.standard_errors[p.name]:.2g}"
              for p in STEP_PARAMETERS if p.name not in fit.held]
    out.print(f"fitted (shared by every system): {', '.join(fitted) or 'none'}")
    held = [f"{name} {getattr(fit.step, name):g}" for name in fit.held]
    out.print(f"held at the replaced file's values (the runs do not determine them): {', '.join(held) or 'none'}")
    scores = [s for f in result.loco for s in f.scores]
    for name, file_runs in files.items():
        ids = {id(run) for run in file_runs}
        for title, chosen in (("before", fit.before), ("after", fit.after), ("held out (LOCO)", scores)):
            out.print(f"{name}, {title}: {summary_of(s for s in chosen if id(s.run) in ids).text()}")


def _calibrate_runs(runs: tuple[str, ...], systems: tuple[str, ...], write: bool, force: bool,
                    with_shipped: bool, bands_path: str | None = None) -> None:
    """--runs: fit the whole-step terms, print each run before and after, refuse or write the system files."""
    if not systems:
        raise InputError("--runs needs --system FILE (repeatable): the system files to write the fitted step terms "
                         "into, each with a '# mapsat-calibrate: step' marker")
    files = _run_files(runs, with_shipped)
    result = calibrate_runs(files, systems, force=force)
    _print_fit(result, files)
    if result.refused and not force:
        raise InputError(f"{result.refused}; nothing written (--force writes it anyway)")
    out = wide_console()
    if result.refused:
        out.print(f"--force: writing although {result.refused}")
    for path, text in result.texts.items():
        if write:
            Path(path).write_text(text, encoding="utf-8")
            out.print(f"wrote {path}")
        else:
            out.print(f"would write {path} (--dry-run)")
    if bands_path is not None:
        _write_bands(Path(bands_path), files, result, write, out)


def _write_bands(path: Path, files: dict[str, tuple], result, write: bool, out) -> None:
    """The error bands the fit leaves, by class (costmodel.measured.error_bands), into `path`;
    the MoE runs are scored on the system files as just written."""
    if not write:
        out.print(f"would write {path} (--dry-run)")
        return
    errors = out_of_sample_errors(files, result.fit, result.loco, RunInputs())
    bands = bands_of(errors)
    write_bands(path, bands, "mapsat calibrate --runs " + " ".join(files) + ": dense runs left out by "
                             "configuration, the runs it does not take (mixture-of-experts, NVFP4; newest of each configuration) as scored")
    out.print(f"wrote {path} ({len(bands)} classes, {len(errors)} runs)")

@click.command("calibrate")
@click.option("--base", "base_path", type=click.Path(dir_okay=False),
              help="System file with '# mapsat-calibrate: ...' markers where fitted fields go.")
@click.option("--measurements", "measurements", type=click.Path(file_okay=False),
              help="Folder of microbenchmark JSON (gemm.json, grouped_gemm.json or grouped_gemm_fwd_bwd.json, attention.json, "
                   "eltwise.json, adam.json, host.json).")
@click.option("--nccl", "nccl", multiple=True, metavar="NETWORK=FILE",
              help="nccl-tests output for the network of that name (repeatable).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Write the calibrated system file here (default: print it).")
@click.option("--runs", "runs", multiple=True, type=click.Path(dir_okay=False),
              help="Measured training runs (a run file, Megatron-Bridge's rows or single-GPU iterations; "
                   "docs/training-runs.md) to fit the whole-step terms to (repeatable). Instead of --base.")
@click.option("--system", "systems", multiple=True, type=click.Path(dir_okay=False),
              help="With --runs: a system file to write the fitted step terms into, in place, at its "
                   "'# mapsat-calibrate: step' marker (repeatable).")
@click.option("--dry-run", is_flag=True, help="With --runs: fit and print, write nothing.")
@click.option("--force", is_flag=True,
              help="With --runs: write a fit that is refused (a term outside its physical range, or worse left "
                   "out than the terms it replaces); the file's header says so.")
@click.option("--bands", "bands_path", type=click.Path(dir_okay=False), default=None,
              help="With --runs: also write the error bands the fit leaves, by class of prediction (GPU generation, "
                   "precision, dense or MoE), to this file (the shipped one: problems/runs/error-bands.json).")
@click.option("--without-shipped-runs", is_flag=True,
              help="With --runs: fit to the given runs alone; by default they extend the runs the shipped terms "
                   "are fitted to (problems/runs/megatron-bridge-pretraining.json, h200-single-gpu-pytorch.json).")
@user_errors
def command(base_path, measurements, nccl, out_path, runs, systems, dry_run, force, bands_path, without_shipped_runs):
    """Fit a system file's kernel times to measurements, or its whole-step terms to runs.

    With --base and --measurements: fits GEMM, fused-attention and HBM kernel times (and network
    efficiency and latency from nccl-tests) and writes them into a system file; prints each
    family's error where fitted and on held-out points.

    With --runs: fits the whole-step terms (the launch gap per kernel, the power window of a
    step's sustained clocks, allocator fragmentation) to the runs' measured step times and
    peaks, one value for every system, and writes them into each --system file; prints each
    run's error before and after, and left out of the fit (leave one configuration out). A term
    the runs do not determine (standard error over half its value) is held at the file's value;
    a term outside its physical range, or a fit worse left out than the terms it replaces, is
    refused (exit 1, nothing written) unless --force. The given runs extend the shipped ones
    unless --without-shipped-runs.

    \b
    Example:
      mapsat calibrate --base problems/systems/calibration/h100-80g-nvl8.base.yaml \\
        --measurements problems/measurements/h100-sxm-80g --out problems/systems/h100-80g-nvl8.yaml
      mapsat calibrate --runs problems/runs/megatron-bridge-pretraining.json \\
        --runs problems/runs/h200-single-gpu-pytorch.json --system problems/systems/h100-80g-nvl8.yaml
    """
    if runs:
        if base_path or measurements or nccl or out_path:
            raise InputError("--runs fits the whole-step terms; --base, --measurements, --nccl and --out fit kernel "
                             "times: give one or the other")
        _calibrate_runs(runs, systems, write=not dry_run, force=force, with_shipped=not without_shipped_runs,
                        bands_path=bands_path)
        return
    if systems or dry_run or force or without_shipped_runs or bands_path:
        raise InputError("--system, --dry-run, --force, --bands and --without-shipped-runs go with --runs")
    if base_path is None or measurements is None:
        raise InputError("give --base and --measurements (kernel times), or --runs (whole-step terms)")
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
