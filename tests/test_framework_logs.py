"""Training logs as runs: a cited Megatron-LM log excerpt with its arguments gives `validate
--runs` the same step time and error as the run file that states the same by hand; warm-up
iterations are left out, the median taken and the spread reported; torchtitan's metric lines
parse as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.errors import InputError
from costmodel.frameworks.logs import megatron_iterations, megatron_peak_memory_bytes, torchtitan_iterations
from costmodel.inputs.units import GiB
from costmodel.measured.run_files import read_runs
from solver.cli.app import cli

DATA = Path(__file__).resolve().parent / "data" / "frameworks"
LOG_RUNS = DATA / "mixtral-issue756-log-runs.yaml"
RUN_FILE = DATA / "mixtral-issue756-runs.yaml"


def test_megatron_log_lines_parse_as_logged():
    records = megatron_iterations((DATA / "mixtral-issue756.log").read_text())
    assert [r.iteration for r in records] == [10, 11, 12, 13]
    assert [r.step_time_s for r in records] == pytest.approx([9.4964, 10.0369, 10.1984, 10.2693], rel=1e-12)
    assert [r.tflops_per_gpu for r in records] == [137.5, 130.1, 128.1, 127.2]
    assert {r.global_batch for r in records} == {128}


def test_log_run_skips_warmup_takes_the_median_and_reports_the_spread():
    (run,) = read_runs(LOG_RUNS)
    # iterations 11-13 after one warm-up: median 10198.4 ms, TFLOP/s median 128.1
    assert run.step_time_s == pytest.approx(10.1984, rel=1e-12)
    assert run.published_tflops_per_gpu == 128.1
    assert "spread 10036.9-10269.3 ms (2.3 % of the median)" in run.notes
    assert (run.num_gpus, run.tp, run.pp, run.ep, run.dp, run.global_batch, run.seq_size) == (16, 4, 1, 4, 4, 128,
                                                                                              4096)


def test_validate_gives_the_log_the_step_time_and_error_of_the_equivalent_run_file():
    def scored(path):
        result = CliRunner().invoke(cli, ["validate", "--runs", str(path), "--no-held-out", "--json"])
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.output)["runs"]
        return row
    from_log, from_file = scored(LOG_RUNS), scored(RUN_FILE)
    assert from_log["status"] == from_file["status"] == "scored"
    for key in ("measured_step_s", "predicted_step_s", "time_error", "predicted_peak_bytes"):
        assert from_log[key] == pytest.approx(from_file[key], rel=1e-12), key


def test_a_log_whose_batch_is_not_its_configurations_is_refused(tmp_path):
    for name in ("mixtral-issue756.sh", "mixtral-issue756-log-runs.yaml"):
        (tmp_path / name).write_text((DATA / name).read_text())
    (tmp_path / "mixtral-issue756.log").write_text((DATA / "mixtral-issue756.log").read_text().replace(
        "global batch size:   128", "global batch size:   256"))
    with pytest.raises(InputError, match=r"global batch size \[256\] is not the configuration's 128"):
        read_runs(tmp_path / "mixtral-issue756-log-runs.yaml")


def test_torchtitan_metric_lines_parse_as_printed():
    (record,) = torchtitan_iterations((DATA / "torchtitan-step.log").read_text())
    assert (record.iteration, record.tokens_per_s_per_gpu, record.tflops_per_gpu) == (20, 4376.0, 253.41)
    assert record.peak_memory_bytes == pytest.approx(48.87 * GiB)


def test_torchtitan_log_run_takes_its_step_time_from_tps(tmp_path):
    # a job written for this test: 8 GPUs of FSDP, 8 sequences of 4096 tokens a step
    (tmp_path / "job.toml").write_text(
        '[parallelism]\ndata_parallel_shard_degree = 8\n[training]\nseq_len = 4096\nlocal_batch_size = 1\n'
        'global_batch_size = 8\n[activation_checkpoint]\nmode = "full"\n')
    lines = [f"step: {s}  loss: 9.0  grad_norm: 1.0  memory: {m}GiB(50.00%)  tps: {t}  tflops: 300.0  mfu: 30.00%"
             for s, m, t in ((1, 40.0, "1,000"), (2, 41.0, "4,000"), (3, 41.5, "4,096"), (4, 41.0, "3,900"))]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "runs.yaml").write_text(
        "log_runs:\n  - {name: tt, log: train.log, configuration: job.toml, model: llama-3.1-8b, "
        "system: h100-80g-nvl8, warmup_iterations: 1}\n")
    (run,) = read_runs(tmp_path / "runs.yaml")
    # median tps 4,000 a GPU: 8·4096 tokens / (4000 · 8) = 1.024 s
    assert run.step_time_s == pytest.approx(8 * 4096 / (4000 * 8), rel=1e-12)
    assert run.peak_memory_bytes == pytest.approx(41.5 * GiB)
    assert (run.num_gpus, run.sharding_stage, run.recompute) == (8, 3, "full")


def test_megatron_memory_reports_give_the_peak():
    # the format of report_memory (Megatron-LM megatron/training/utils/common_utils.py:313 at d98e8a64);
    # the numbers are made up for the test
    text = ("[Rank 0] (after 10 iterations) memory (MB) | allocated: 1000.00 | max allocated: 60000.00 | "
            "reserved: 70000.00 | max reserved: 71234.50\n"
            "[Rank 8] (after 10 iterations) memory (MB) | allocated: 900.00 | max allocated: 50000.00 | "
            "reserved: 60000.00 | max reserved: 64000.00\n")
    assert megatron_peak_memory_bytes(text) == 71234.5 * 1024 ** 2
    assert megatron_peak_memory_bytes("no report") is None
