"""`mapsat plot` and solver/report/plots.py on hand-made results: which kinds the results can fill,
that each writes PNG files, and the command's errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.errors import InputError
from solver.cli.app import cli
from solver.report.plots import available_kinds, make_plots, varying

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_record(params: float, gpus: int, offload_gib: float, gbps: float | None, hbm: float = 80,
                status: str | None = None) -> dict:
    """A result record as `mapsat batch` writes it, with a made-up MFU that falls with size
    and rises with offload capacity; huge models without offload are infeasible."""
    unbounded = gbps == "unbounded"
    if status is None:
        status = "infeasible" if (offload_gib == 0 and params > 10e12) else "optimal"
    mfu = None if status != "optimal" else max(0.05, 0.7 - 0.05 * (params / 1e12) ** 0.3 + offload_gib / 1e4)
    name = f"m{params / 1e12:g}t"
    return {
        "id": f"{name}__g{gpus}__off{offload_gib:g}g{gbps}__hbm{hbm:g}", "status": status,
        "problem": {"model": {"name": name, "params": params, "num_blocks": 128},
                    "system": {"name": "h100", "hbm_gib": hbm, "offload_gib": offload_gib,
                               "offload_gbps": None if not offload_gib else (3350 if unbounded else gbps),
                               "offload_unbounded": unbounded and bool(offload_gib), "nvlink_size": 8},
                    "gpus": gpus, "datatype": "float8", "space": "full", "max_batch": 3072},
        "best": None if mfu is None else {"mfu": mfu, "iteration_time_s": 10.0, "mapping": {}, "memory": {}},
        "mappings": 1000,
        **({"error": "boom"} if status == "error" else {}),
    }


def write_results(directory: Path, records: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


@pytest.fixture
def sweep() -> list[dict]:
    """Sizes × GPU counts × offload (none, 512 and 1024 GiB at 50/unbounded), one error."""
    records = []
    for params, gpus in itertools.product([1e12, 32e12, 128e12], [4096, 8192]):
        records.append(fake_record(params, gpus, 0, None))
        for gib, gbps in itertools.product([512, 1024], [50, "unbounded"]):
            records.append(fake_record(params, gpus, gib, gbps))
    records.append(fake_record(2e12, 4096, 512, 50, status="error"))
    return records


def test_kinds_follow_what_varies(sweep):
    assert set(varying(sweep)) == {"params", "gpus", "offload_gib", "offload_gbps"}
    assert available_kinds(sweep) == ["size", "gpus", "offload", "bandwidth", "heatmap", "summary"]
    only_gpus = [fake_record(1e12, g, 0, None) for g in (4096, 8192, 16384)]
    assert available_kinds(only_gpus) == ["gpus", "summary"]


def test_gradient_datatypes_vary_like_any_problem_setting():
    def with_grads(record: dict, grads: str | None) -> dict:
        problem = dict(record["problem"], **({"grad_datatype": grads} if grads else {}))
        return {**record, "id": f"{record['id']}__{grads}", "problem": problem}

    both = [with_grads(fake_record(1e12, g, 0, None), grads) for g in (4096, 8192) for grads in ("float32", "16bit")]
    assert varying(both) == ["gpus", "grad_datatype"]
    assert available_kinds(both) == ["gpus", "summary"]
    # a record written before the setting existed reads as the default, float32
    older = [with_grads(fake_record(1e12, 4096, 0, None), None), with_grads(fake_record(1e12, 8192, 0, None), "float32")]
    assert varying(older) == ["gpus"]


def test_every_kind_writes_png_files(sweep, tmp_path):
    paths = make_plots(sweep, tmp_path)
    names = {p.name for p in paths}
    assert {"summary.png", "heatmap-offload-by-params--gpus-4096.png"} <= names
    assert any(n.startswith("mfu-vs-size") for n in names) and any(n.startswith("mfu-vs-bandwidth") for n in names)
    assert "heatmap-offload-by-params--gpus-8192.png" in names
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_too_many_lines_split_into_files(sweep, tmp_path):
    paths = make_plots(sweep, tmp_path, ["size"])
    assert sorted(p.name for p in paths) == ["mfu-vs-size--gpus-4096.png", "mfu-vs-size--gpus-8192.png"]


def test_kind_the_results_cannot_fill(tmp_path):
    records = [fake_record(1e12, g, 0, None) for g in (4096, 8192)]
    with pytest.raises(InputError, match=r"--kind heatmap: these results cannot fill it \(available: gpus, summary\)"):
        make_plots(records, tmp_path, ["heatmap"])


def test_plot_command(sweep, tmp_path):
    results = write_results(tmp_path / "run", sweep)
    result = CliRunner().invoke(cli, ["plot", str(results), "--kind", "gpus", "--kind", "summary"])
    assert result.exit_code == 0, result.output
    written = [Path(line) for line in result.output.splitlines()]
    assert written and all(p.parent == results / "plots" and p.exists() for p in written)
    other = CliRunner().invoke(cli, ["plot", str(results), "--out", str(tmp_path / "pngs"), "--kind", "summary"])
    assert other.exit_code == 0 and (tmp_path / "pngs" / "summary.png").exists()


@pytest.mark.parametrize("setup, args, code, message", [
    (None, ["--kind", "pie"], 2, "Invalid value for '--kind'"),
    (None, [], 1, "no such directory"),
    ("empty", [], 1, "has no results.jsonl"),
    ("blank", [], 1, "no results to plot"),
])
def test_plot_errors(tmp_path, setup, args, code, message):
    directory = tmp_path / "run"
    if setup:
        directory.mkdir()
    if setup == "blank":
        (directory / "results.jsonl").write_text("")
    result = CliRunner().invoke(cli, ["plot", str(directory), *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


def test_no_heatmap_for_dimensions_that_vary_together(tmp_path):
    # With and without one offload memory: its capacity decides its bandwidth (none without
    # it), so a capacity × bandwidth heatmap would fill a diagonal; lines are drawn instead.
    together = [fake_record(1e12, 4096, gib, gbps) for gib, gbps in ((0, None), (512, 100))]
    assert "heatmap" not in available_kinds(together)
    with pytest.raises(InputError, match="--kind heatmap: these results cannot fill it"):
        make_plots(together, tmp_path, kinds=["heatmap"])
    crossed = [fake_record(1e12, 4096, gib, gbps) for gib, gbps in itertools.product([512, 1024], [50, 100])]
    assert "heatmap" in available_kinds(crossed)


def test_breakdown_draws_each_best_mapping_and_units_read_as_people_write_them(tmp_path):
    from solver.report.breakdown_plot import mapping_label
    from solver.report.figure import params_text

    assert [params_text(x) for x in (7.82e10, 1.1e12, 3.5e8)] == ["78.2B", "1.1T", "350M"]
    mapping = {"tensor_par": 8, "pipeline_par": 4, "data_par": 128, "microbatch_size": 1, "pipeline_interleaving": 2}
    assert mapping_label(mapping) == "tp8 pp4 dp128 mb1 il2"
    record = {"id": "p", "status": "optimal", "problem": {"model": {"params": 7.8e10}},
              "best": {"mapping": mapping, "mfu": 0.5, "iteration_time_s": 2.0,
                       "time": {"forward_s": 0.5, "backward_s": 1.0, "bubble_s": 0.5}}}
    paths = make_plots([record], tmp_path, kinds=["breakdown"])
    assert [p.name for p in paths] == ["breakdown.png"] and paths[0].stat().st_size > 0
