"""Batches: the file format (expansion, ids, one-line errors), the results store (resume,
no duplicates, a half-written line redone), the runner (a failing problem is recorded and
the batch goes on; hard time limits), interruption of the real command by SIGINT and
SIGKILL, and Dask on a local cluster. Problems are tiny so the whole file takes seconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conftest import H100_SYSTEM, MODELS_DIR
from costmodel.errors import InputError
from costmodel.inputs.model import Model
from solver.study import runner as runner_module
from solver.study.batch import Problem, load_batch, problem_id
from solver.study.runner import run_batch
from solver.cli.app import cli
from solver.study.store import ResultStore, read_results

TOY = {"name": "toy", "hidden": 512, "feedforward": 2048, "seq_size": 1024, "attn_heads": 8, "attn_size": 64,
       "num_blocks": 4}


def batch_doc(**changes) -> dict:
    """A small valid batch: the toy model on 1, 2 and 4 H100s, 4 problems with the offload grid."""
    doc = {"models": [TOY], "systems": str(H100_SYSTEM), "gpus": [1, 2], "max_batch": 8, "time_limit_s": 10,
           "overrides": {"offload_gib": [0, 64], "offload_gbps": 100}}
    doc.update(changes)
    return doc


@pytest.fixture
def batch_file(tmp_path):
    def write(doc: dict | str, name: str = "batch.yaml") -> Path:
        path = tmp_path / name
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
        return path
    return write


def ids_in(out: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------- the file format
def test_grid_expands_in_file_order_with_readable_ids(batch_file):
    problems = load_batch(batch_file(batch_doc(gpus=[1, 2, 4], datatype=["bfloat16", "float8"])))
    assert len(problems) == 3 * 2 * 2
    assert problems[0].id == "toy__h100-80g-nvl8__g1__bf16__b8__nooff"
    assert problems[1].id == "toy__h100-80g-nvl8__g1__bf16__b8__off64g100"
    assert problems[-1].id == "toy__h100-80g-nvl8__g4__fp8__b8__off64g100"
    assert len({p.id for p in problems}) == len(problems)


def test_id_of_the_paper_example():
    model = Model(**{**TOY, "name": "gpt-1t-256b"})
    from costmodel.inputs.system import Datatype
    assert problem_id(model, "h100-80g-nvl8", 4096, Datatype.float8, 3072, "full",
                      {"offload_gib": 1024, "offload_gbps": 100}) == "gpt-1t-256b__h100-80g-nvl8__g4096__fp8__off1024g100"


def test_attention_kernels_expand_and_reach_the_solver(batch_file, tmp_path):
    problems = load_batch(batch_file(batch_doc(gpus=1, attention=["fused", "unfused"],
                                               overrides={"offload_gib": 0})))
    assert [p.id for p in problems] == ["toy__h100-80g-nvl8__g1__bf16__b8__nooff",
                                        "toy__h100-80g-nvl8__g1__bf16__b8__unfused-attn__nooff"]
    run_batch(problems, tmp_path / "out", jobs=1)
    records = {r["id"]: r for r in read_results(tmp_path / "out")}
    fused, unfused = (records[p.id] for p in problems)
    assert fused["problem"]["attention"] == "fused" and unfused["problem"]["attention"] == "unfused"
    assert fused["best"]["mapping"]["fused_attention"] is True
    assert unfused["best"]["mapping"]["fused_attention"] is False
    assert fused["best"]["iteration_time_s"] != unfused["best"]["iteration_time_s"]


def test_grad_datatypes_expand_and_reach_the_solver(batch_file, tmp_path):
    """A memory-tight problem (4 H100s cut to 3.5 GiB, as in test_grad_datatype.py): no
    mapping fits with float32 main gradients, one does with 16-bit gradients."""
    tight = {"name": "tight", "hidden": 2048, "feedforward": 8192, "seq_size": 2048, "attn_heads": 32,
             "attn_size": 64, "num_blocks": 4}
    problems = load_batch(batch_file(batch_doc(models=[tight], gpus=4, grad_datatype=["float32", "16bit"],
                                               overrides={"hbm_gib": 3.5})))
    assert [p.id for p in problems] == ["tight__h100-80g-nvl8__g4__bf16__b8__hbm3.5",
                                        "tight__h100-80g-nvl8__g4__bf16__b8__16bit-grads__hbm3.5"]
    run_batch(problems, tmp_path / "out", jobs=1)
    records = {r["id"]: r for r in read_results(tmp_path / "out")}
    fp32, half = (records[p.id] for p in problems)
    assert fp32["problem"]["grad_datatype"] == "float32" and half["problem"]["grad_datatype"] == "16bit"
    assert fp32["status"] == "infeasible" and fp32["best"] is None
    assert half["status"] == "optimal" and half["best"]["mapping"]["grad_datatype"] == "16bit"
    csv = (tmp_path / "out" / "results.csv").read_text().splitlines()
    column = csv[0].split(",").index("grad_datatype")
    assert sorted(line.split(",")[column] for line in csv[1:]) == ["16bit", "float32"]


def test_grad_datatype_in_a_grid_replaces_the_top_level_one(batch_file):
    doc = batch_doc(gpus=1, grad_datatype="16bit", overrides={"offload_gib": 0},
                    grids=[{}, {"grad_datatype": "float32"}])
    assert [p.grad_datatype for p in load_batch(batch_file(doc))] == ["16bit", "float32"]


def test_no_offload_merges_its_bandwidths_and_unbounded_is_hbm_speed(batch_file):
    problems = load_batch(batch_file(batch_doc(gpus=1, overrides={"offload_gib": [0, 1024],
                                                                  "offload_gbps": ["unbounded", 100]})))
    assert [p.id.split("__")[-1] for p in problems] == ["nooff", "off1024ginf", "off1024g100"]
    nooff, unbounded, slow = problems
    assert nooff.system.offload is None
    assert unbounded.system.offload.bandwidth_gbps == unbounded.system.hbm.bandwidth_gbps
    assert unbounded.to_dict()["system"]["offload_unbounded"] is True
    assert slow.system.offload.bandwidth_gbps == 100 and not slow.offload_unbounded


def test_resolved_problem_names_everything(batch_file):
    problem = load_batch(batch_file(batch_doc(gpus=2, overrides={"hbm_gib": 120, "nvlink_size": 16})))[0]
    resolved = problem.to_dict()
    assert resolved["model"]["num_blocks"] == 4 and resolved["model"]["params"] == Model(**TOY).total_params
    assert resolved["system"] == {"name": "h100-80g-nvl8", "source": str(H100_SYSTEM), "hbm_gib": 120,
                                  "offload_gib": 0, "offload_gbps": None, "offload_unbounded": False,
                                  "nvlink_size": 16, "hbm_headroom_gib": 0.0}
    assert resolved["overrides"] == {"hbm_gib": 120, "nvlink_size": 16}
    assert (resolved["gpus"], resolved["max_batch"], resolved["datatype"], resolved["space"]) == (2, 8, "bfloat16", "full")
    assert problem.id == "toy__h100-80g-nvl8__g2__bf16__b8__hbm120__nvl16"


def test_paths_are_relative_to_the_batch_file_and_grids_share_top_level_values(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "toy.yaml").write_text(yaml.safe_dump(TOY))
    doc = {"systems": str(H100_SYSTEM), "gpus": 8, "time_limit_s": 5,
           "grids": [{"models": "../models/toy.yaml"},
                     {"models": str(MODELS_DIR / "gpt-1.3b.yaml"), "gpus": [8, 16], "space": "calculon-2023"}]}
    path = tmp_path / "sub" / "b.yaml"
    path.write_text(yaml.safe_dump(doc))
    problems = load_batch(path)
    assert [p.id for p in problems] == ["toy__h100-80g-nvl8__g8__bf16", "gpt-1.3b__h100-80g-nvl8__g8__bf16__calculon-2023",
                                        "gpt-1.3b__h100-80g-nvl8__g16__bf16__calculon-2023"]
    assert all(p.time_limit_s == 5 for p in problems)
    assert load_batch(path, time_limit_s=2)[0].time_limit_s == 2


def test_paper_batches_load():
    counts = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "problems" / "paper").glob("*.yaml")):
        counts[path.stem] = len(load_batch(path))
    assert counts == {"fig2-mappability": 14, "fig4-offload": 30, "fig5-offload-capacity": 72,
                      "fig7-strong-scaling": 28, "fig8-128T": 56}


@pytest.mark.parametrize("change, message", [
    ({"gpu": 4}, "unknown field 'gpu' (did you mean 'gpus'?)"),
    ({"gpus": [4, 0]}, "field 'gpus.1' 0: Input should be greater than 0"),
    ({"gpus": "many"}, "field 'gpus.0' 'many'"),
    ({"gpus": 2.5}, "field 'gpus.0' 2.5"),
    ({"attention": "flash"}, "field 'attention.0' 'flash': Input should be 'fused' or 'unfused'"),
    ({"grad_datatype": "fp8"}, "field 'grad_datatype.0' 'fp8': Input should be 'float32' or '16bit'"),
    ({"grad_datatype": ["16bit", 16]}, "field 'grad_datatype.1' 16: Input should be 'float32' or '16bit'"),
    ({"datatype": "float7"}, "field 'datatype.0' 'float7'"),
    ({"space": "huge"}, "field 'space.0' 'huge'"),
    ({"overrides": {"offload_gbps": "fast"}}, "field 'overrides.offload_gbps.0"),
    ({"overrides": {"hbm_gb": 80}}, "unknown field 'overrides.hbm_gb' (did you mean 'hbm_gib'?)"),
    ({"overrides": {"hbm_gib": -1}}, "field 'overrides.hbm_gib.0' -1"),
    ({"time_limit_s": 0}, "field 'time_limit_s' 0"),
    ({"models": None}, "missing field 'models'"),
    ({"models": ["nowhere.yaml"]}, "nowhere.yaml: no such file"),
    ({"models": [{**TOY, "hidden": 0}]}, "models 'toy': field 'hidden' 0"),
    ({"models": [{k: v for k, v in TOY.items() if k != "name"}]}, "an inline entry of 'models' needs a name"),
    ({"models": [TOY, {**TOY, "num_blocks": 8}]}, "two different problems get the id"),
    ({"overrides": {"offload_gbps": 50}}, "has no offload memory; give --offload-gib too"),
    ({"grids": []}, "field 'grids'"),
])
def test_batch_file_errors_are_one_line(batch_file, change, message):
    doc = batch_doc(**change)
    if change.get("models", "") is None:
        del doc["models"]
    with pytest.raises(InputError) as err:
        load_batch(batch_file(doc))
    text = str(err.value)
    assert message in text and "batch.yaml" in text and "\n" not in text


def test_malformed_yaml_and_missing_file(batch_file, tmp_path):
    with pytest.raises(InputError, match=r"not valid YAML at line 2"):
        load_batch(batch_file("gpus: [1\nmodels: x\n"))
    with pytest.raises(InputError, match=r"no such file"):
        load_batch(tmp_path / "absent.yaml")


def test_datatype_the_system_lacks(batch_file, system_data):
    doc = batch_doc(systems=[system_data], datatype="float8")
    with pytest.raises(InputError, match="has no float8 compute"):
        load_batch(batch_file(doc))


# ---------------------------------------------------------------------- the store
def record(i: int, status: str = "optimal") -> dict:
    return {"id": f"p{i}", "status": status, "problem": {}, "best": None}


def test_store_appends_whole_lines_and_never_duplicates(tmp_path):
    with ResultStore.open(tmp_path) as store:
        store.append(record(1))
        store.append(record(2))
        store.append(record(1))
    with ResultStore.open(tmp_path) as store:
        assert list(store.records) == ["p1", "p2"] and not store.warnings
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 2


def test_store_drops_a_half_written_last_line(tmp_path):
    with ResultStore.open(tmp_path) as store:
        store.append(record(1))
        store.append(record(2))
    path = tmp_path / "results.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # killed in the middle of writing p2
    with ResultStore.open(tmp_path) as store:
        assert list(store.records) == ["p1"]
        assert "partial last line" in store.warnings[0]
        store.append(record(2))
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["p1", "p2"]


def test_store_drops_garbage_and_repeated_lines(tmp_path):
    path = tmp_path / "results.jsonl"
    lines = [json.dumps(record(1)), "not json", json.dumps(record(1)), json.dumps({"no": "id"}), json.dumps(record(2))]
    path.write_text("\n".join(lines) + "\n")
    with ResultStore.open(tmp_path) as store:
        assert list(store.records) == ["p1", "p2"]
        assert len(store.warnings) == 3
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["p1", "p2"]
    assert [r["id"] for r in read_results(tmp_path)] == ["p1", "p2"]


def test_store_is_locked_against_a_second_writer(tmp_path):
    with ResultStore.open(tmp_path):
        with pytest.raises(InputError, match="another `mapsat batch` is writing there"):
            ResultStore.open(tmp_path)
    ResultStore.open(tmp_path).close()


def test_read_results_errors(tmp_path):
    with pytest.raises(InputError, match="no such directory"):
        read_results(tmp_path / "absent")
    with pytest.raises(InputError, match="has no results.jsonl"):
        read_results(tmp_path)


# ---------------------------------------------------------------------- the runner
def broken(problem: Problem) -> Problem:
    """The same problem with a model the worker cannot rebuild (its solve fails)."""
    bad = Model.model_construct(**{**problem.model.model_dump(), "hidden": -1})
    return Problem(**{**problem.__dict__, "id": problem.id + "__broken", "model": bad})


def test_run_solves_records_errors_resumes_and_writes_csv(batch_file, tmp_path):
    problems = load_batch(batch_file(batch_doc()))
    problems.insert(1, broken(problems[0]))
    out = tmp_path / "out"
    summary = run_batch(problems, out, jobs=2)
    assert summary.solved == 5 and summary.skipped == 0 and not summary.interrupted
    assert summary.by_status == {"error": 1, "optimal": 4}
    records = {r["id"]: r for r in read_results(out)}
    assert sorted(records) == sorted(p.id for p in problems)
    error = records[problems[1].id]
    assert error["status"] == "error" and "hidden" in error["error"] and error["problem"]["gpus"] == 1
    solved = records[problems[0].id]
    assert set(solved["best"]) >= {"mapping", "iteration_time_s", "mfu", "memory"}
    assert solved["best"]["mapping"]["num_procs"] == 1 and solved["certified_optimal"] is True
    assert solved["problem"]["model"]["num_blocks"] == 4 and solved["mappings"] > 0
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("id,status,model,params")
    assert [line.split(",")[0] for line in csv_lines[1:]] == [p.id for p in problems]

    again = run_batch(problems, out, jobs=2)
    assert again.solved == 0 and again.skipped == 5
    retried = run_batch(problems, out, jobs=2, retry_errors=True)
    assert retried.solved == 1 and retried.errors == 1
    assert sorted(ids_in(out)) == sorted(p.id for p in problems)


@pytest.mark.skipif(sys.platform != "linux", reason="the patched solve reaches the workers through fork")
def test_a_problem_over_its_hard_limit_is_killed_and_recorded(monkeypatch, batch_file, tmp_path):
    problems = load_batch(batch_file(batch_doc(gpus=4, overrides={})))
    monkeypatch.setattr(runner_module, "hard_limit_s", lambda limit: 0.2)

    def hangs(payload, progress):  # a solve that says what it is doing, then hangs
        progress("warm start: scoring blocks")
        time.sleep(60)

    monkeypatch.setattr(runner_module, "solve_payload", hangs)
    summary = run_batch(problems, tmp_path / "out", jobs=1)
    assert summary.by_status == {"error": 1}
    error = read_results(tmp_path / "out")[0]["error"]
    assert "hard time limit of 0.2 s" in error and error.endswith("while warm start: scoring blocks")


def test_dask_on_a_local_cluster(batch_file, tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    problems = load_batch(batch_file(batch_doc()))
    problems.append(broken(problems[0]))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        summary = run_batch(problems, tmp_path / "out", dask_address=cluster.scheduler_address)
    assert summary.by_status == {"error": 1, "optimal": 4}
    assert sorted(ids_in(tmp_path / "out")) == sorted(p.id for p in problems)


def test_dask_missing_is_one_line(monkeypatch, batch_file, tmp_path):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    result = CliRunner().invoke(cli, ["batch", str(batch_file(batch_doc())), "--out", str(tmp_path / "o"),
                                      "--dask", "tcp://127.0.0.1:1"])
    assert result.exit_code == 1
    assert "install 'mapsat[dask]' (the dask extra)" in result.output and "Traceback" not in result.output


# ---------------------------------------------------------------------- the command
def test_batch_command_runs_and_resumes(batch_file, tmp_path):
    path, out = batch_file(batch_doc(gpus=1)), tmp_path / "out"
    runner = CliRunner()
    first = runner.invoke(cli, ["batch", str(path), "--out", str(out), "--jobs", "2", "--quiet"])
    assert first.exit_code == 0, first.output
    assert "2 of 2 problems done (2 optimal); solved 2 in this run" in first.output
    second = runner.invoke(cli, ["batch", str(path), "--out", str(out), "--quiet"])
    assert second.exit_code == 0 and "solved 0 in this run, 2 from earlier runs" in second.output


@pytest.mark.parametrize("args, code, message", [
    (["--jobs", "0"], 2, "Invalid value for '--jobs'"),
    (["--time-limit", "-1"], 2, "Invalid value for '--time-limit'"),
])
def test_batch_command_usage_errors(batch_file, tmp_path, args, code, message):
    result = CliRunner().invoke(cli, ["batch", str(batch_file(batch_doc())), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == code and message in result.output


def test_batch_command_file_error_is_one_line(batch_file, tmp_path):
    result = CliRunner().invoke(cli, ["batch", str(batch_file(batch_doc(gpus=0))), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and result.output.startswith("error: ") and "gpus.0" in result.output


# ---------------------------------------------------------------------- interruption
def slow_batch(batch_file) -> Path:
    """Six tiny problems; `start` makes each take at least half a second."""
    return batch_file(batch_doc(gpus=[2, 4, 8], overrides={"offload_gib": [0, 64]}))


# The batch command, with every problem's solve delayed by 0.5 s so that a signal reliably
# lands mid-run however fast the solver gets. The workers are forked, so they inherit it.
SLOW_MAIN = """
import time, solver.study.runner as runner
solve = runner.solve_payload
runner.solve_payload = lambda payload, progress=None: (time.sleep(0.5), solve(payload, progress))[1]
from solver.cli.app import main
main()
"""


def start(path: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLOW_MAIN, "batch", str(path), "--out", str(out), "--jobs", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])


def wait_for_lines(out: Path, n: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = out / "results.jsonl"
        if path.exists() and path.read_text().count("\n") >= n:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} results after {timeout} s")


def finish(path: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from solver.cli.app import main; main()", "batch", str(path), "--out",
                           str(out), "--jobs", "2"], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])


@pytest.mark.slow   # 24 s: two batches interrupted by a signal and resumed
@pytest.mark.skipif(sys.platform != "linux", reason="the delayed solve reaches the workers through fork")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_batch_resumes_and_solves_everything_once(batch_file, tmp_path, sig):
    path, out = slow_batch(batch_file), tmp_path / "out"
    expected = [p.id for p in load_batch(path)]
    process = start(path, out)
    wait_for_lines(out, 2, process)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert process.returncode == 130, stderr
        assert b"interrupted: rerun the same command" in stderr
        assert (out / "results.csv").exists()
    else:
        assert process.returncode == -signal.SIGKILL
    done_before = ids_in(out)
    assert 2 <= len(done_before) < len(expected)
    rerun = finish(path, out)
    assert rerun.returncode == 0, rerun.stderr
    assert f"solved {len(expected) - len(done_before)} in this run" in rerun.stdout
    assert sorted(ids_in(out)) == sorted(expected)  # every problem exactly once


def test_half_written_last_line_is_redone(batch_file, tmp_path):
    path, out = batch_file(batch_doc(gpus=[1, 2], overrides={})), tmp_path / "out"
    assert finish(path, out).returncode == 0
    results = out / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    results.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # as if killed mid-write
    rerun = finish(path, out)
    assert rerun.returncode == 0, rerun.stderr
    assert "dropped a partial last line" in rerun.stderr
    assert "solved 1 in this run" in rerun.stdout
    assert sorted(ids_in(out)) == sorted(p.id for p in load_batch(path))


def test_store_writes_strict_json(tmp_path):
    with ResultStore.open(tmp_path) as store:
        store.append({**record(1), "gap": float("inf"), "best": {"mfu": float("nan")}})
    assert json.loads((tmp_path / "results.jsonl").read_text()) == {**record(1), "gap": None, "best": {"mfu": None}}


def test_fixed_dimensions_and_fixed_batch_reach_the_solver(batch_file, tmp_path):
    doc = batch_doc(gpus=[4], fix={"tp": 2, "recompute": ["full", "none"]}, batch=[4, 8])
    del doc["max_batch"]
    problems = load_batch(batch_file(doc))
    assert {p.max_batch for p in problems} == {4, 8}
    assert all(p.fix[:2] == ("tp=2", "recompute=full,none") and p.fix[2] == f"batch={p.max_batch}" for p in problems)
    out = tmp_path / "out"
    run_batch(problems, out, jobs=1)
    for record in read_results(out):
        mapping = record["best"]["mapping"]
        assert mapping["tensor_par"] == 2 and mapping["activation_recompute"] in ("full", "none")
        assert mapping["batch_size"] == record["problem"]["max_batch"]


@pytest.mark.parametrize("changes, message", [
    ({"fix": {"tpp": 2}}, "'tpp' is not a dimension (did you mean tp?)"),
    ({"fix": {"recompute": "most"}}, "'most' is not a recompute"),
    ({"batch": 8}, "'batch' fixes the global batch and 'max_batch' caps it: give one"),
])
def test_bad_fix_in_a_batch_file_is_one_line(batch_file, changes, message):
    with pytest.raises(InputError) as raised:
        load_batch(batch_file(batch_doc(**changes)))
    assert message in str(raised.value) and "\n" not in str(raised.value)
