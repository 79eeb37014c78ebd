"""What a user reads fits the terminal: at 80 and 120 columns (COLUMNS, as a pipe or a
terminal states it) the `plan` and `count` tables cut no figure — a column too many is left
out by priority and named, `--wide` shows it — every line is within the width, and a reason
is said once with the counts it applies to."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from solver.cli.app import cli

SELENE = ["--model", "problems/models/gpt3-13b.yaml", "--system", "problems/systems/a100-80g-selene.yaml"]
PLAN = [*SELENE, "--gpus", "8-64:8", "--tokens", "1e12", "--gpu-hour-price", "2", "--gpu-power-w", "400",
        "--batch", "1000"]


def run(*args, columns: int | None = None):
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": str(columns)} if columns else None)
    assert result.exit_code in (0, 1), result.output
    return result


@pytest.mark.parametrize("columns", [80, 120])
def test_the_plan_table_cuts_no_figure(columns):
    result = run("plan", *PLAN, columns=columns)
    text = result.stdout
    assert "…" not in text
    assert all(len(line) <= columns for line in text.splitlines()), max(text.splitlines(), key=len)
    document = json.loads(run("plan", *PLAN, "--json").stdout)
    for row in document["counts"]:              # every count's days and MFU, whole
        assert re.search(rf"^\s*\*?\s+{row['num_gpus']:,}\s+{row['wall_days']:,.1f}\s", text, re.M), row["num_gpus"]
        assert f"{row['mfu']:.1%}" in text
    if columns == 80:
        assert "left out at 80 columns: energy MWh" in text
        wide = run("plan", *PLAN, "--wide", columns=columns).stdout
        assert "energy MWh" in wide and "MTBF h" in wide and "left out" not in wide


@pytest.mark.parametrize("columns", [80, 120])
def test_the_count_table_wraps_rather_than_cuts(columns):
    text = run("count", *SELENE, "--gpus", 64, columns=columns).stdout
    assert "…" not in text and all(len(line) <= columns for line in text.splitlines())
    document = json.loads(run("count", *SELENE, "--gpus", 64, "--json").stdout)
    flat = " ".join(text.split())
    for name, values in document["by_dimension"].items():
        for value, count in values.items():      # each figure whole, if wrapped after its value
            assert f"{count:,}" in flat, (name, value)


def test_an_infeasible_reason_is_said_once_with_its_counts():
    result = run("plan", *SELENE, "--gpus", "8-64:8", "--tokens", "1e12", "--batch", "1000")
    reasons = [line for line in result.stdout.splitlines() if line.startswith("  ") and "GPUs:" in line]
    assert len(reasons) == len({line.split("GPUs:", 1)[1] for line in reasons})


# ---- the question behind an infeasible answer

SMALL = {"name": "small", "hidden": 512, "feedforward": 2048, "seq_size": 512, "attn_heads": 8, "attn_size": 64,
         "num_blocks": 8, "vocab_size": 32000}


def _smallest_named(args: list) -> int:
    result = run("solve", *args)
    assert result.exit_code == 1
    found = re.search(r"the smallest GPU count that fits, in whole \w+ domains of \d+ or a part of one: ([0-9,]+) "
                      r"\(--gpus \d+\)", result.output)
    assert found, result.output
    return int(found[1].replace(",", ""))


def test_an_infeasible_count_names_the_smallest_count_solve_then_accepts(tmp_path):
    import yaml

    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    problem = ["--model", path, "--system", "problems/systems/a100-80g-selene.yaml", "--hbm-gib", 2.4, "--quiet"]
    fits = _smallest_named([*problem, "--gpus", 1])
    assert fits > 1
    assert run("solve", *problem, "--gpus", fits).exit_code == 0
    for below in range(2, fits):                  # every count a cluster is bought in below it: infeasible
        if 8 % below == 0:
            assert run("solve", *problem, "--gpus", below).exit_code == 1


@pytest.mark.slow
def test_405b_on_8_h100s_names_a_count_solve_accepts():
    problem = ["--model", "problems/models/llama-3.1-405b/config.json", "--seq-size", 8192,
               "--system", "problems/systems/h100-80g-nvl8.yaml", "--quiet"]
    fits = _smallest_named([*problem, "--gpus", 8])
    assert run("solve", *problem, "--gpus", fits).exit_code == 0


def test_a_given_batch_no_split_divides_names_the_nearest_that_work():
    # pp fixed to 1: with pipelines, a short last chunk lays 32 blocks over 3 stages (11, 11,
    # 10), and tp 8 · pp 3 leaves dp 1, which divides any batch
    problem = ["--model", "problems/models/llama-3.1-8b/config.json", "--seq-size", 8192,
               "--system", "problems/systems/h100-80g-nvl8.yaml", "--gpus", 24, "--fix", "pp=1"]
    result = run("solve", *problem, "--batch", 2048)
    found = re.search(r"nearest batches that work: ([0-9,]+) or ([0-9,]+)", result.output)
    assert found and len(result.output.splitlines()[-1]) <= 300, result.output
    below, above = (int(x.replace(",", "")) for x in found.groups())
    assert below < 2048 < above
    for batch in (below, above):
        assert run("solve", *problem, "--batch", batch, "--time-limit", 20).exit_code == 0
    for batch in range(below + 1, above):        # and none between them has a split
        assert json.loads(run("count", *problem, "--batch", batch, "--json").stdout)["mappings"] == 0


# ---- right words

@pytest.mark.parametrize("command", ["solve", "plan", "brute", "explain", "count", "codesign", "batch", "eval"])
def test_no_help_shows_a_bound_of_none(command):
    text = run(command, "--help").output
    assert "None]" not in text and "x<=None" not in text


def test_counts_read_singular_for_one_and_one_stage_has_no_second_or_last_rows(tmp_path):
    mapping = tmp_path / "one-stage.json"
    mapping.write_text(json.dumps({"num_procs": 8, "tensor_par": 8, "pipeline_par": 1, "data_par": 1,
                                   "batch_size": 8, "microbatch_size": 1, "datatype": "bfloat16"}))
    text = run("eval", *SELENE, "--mapping", mapping, columns=160).stdout
    assert "second stage" not in text and "last stage: stored activations" not in text
    from solver.report.tables import counted

    assert (counted(1, "block"), counted(2, "run"), counted(1024, "mapping")) == ("1 block", "2 runs", "1,024 mappings")


def test_a_batch_table_states_step_time_tokens_per_gpu_and_cost_beside_mfu():
    from solver.report.documents import gpu_hours_per_million_tokens, tokens_per_s_per_gpu
    from solver.study.store import CSV_COLUMNS, csv_row

    record = {"id": "x", "status": "optimal", "problem": {"gpus": 64, "model": {"seq_size": 2048}},
              "best": {"iteration_time_s": 2.0, "mfu": 0.5, "mapping": {"batch_size": 1024}}}
    assert tokens_per_s_per_gpu(record) == pytest.approx(1024 * 2048 / (2.0 * 64), rel=1e-12)
    row = csv_row(record)
    assert CSV_COLUMNS.index("tokens_per_s_per_gpu") == CSV_COLUMNS.index("mfu") - 2
    assert row["tokens_per_s_per_gpu"] == pytest.approx(16384.0) and row["iteration_time_s"] == 2.0
    # the cost without a price: 1M tokens at 16,384 tokens/s per GPU take 61.0 GPU-seconds
    assert row["gpu_hours_per_1m_tokens"] == pytest.approx(1e6 / 16384.0 / 3600.0, rel=1e-12)
    assert gpu_hours_per_million_tokens({"id": "y", "status": "infeasible", "best": None}) is None
    assert tokens_per_s_per_gpu({"id": "y", "status": "infeasible", "best": None}) is None


def test_a_plan_where_no_count_fits_names_the_smallest_count_that_plans(tmp_path):
    import yaml

    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    problem = ["--model", path, "--system", "problems/systems/a100-80g-selene.yaml", "--hbm-gib", 2.4, "--quiet",
               "--tokens", "1e9"]
    result = run("plan", *problem, "--gpus", "1,2")
    found = re.search(r"the smallest GPU count that fits, in whole \w+ domains of \d+ or a part of one: (\d+)",
                      result.output)
    assert result.exit_code == 1 and found, result.output
    assert run("plan", *problem, "--gpus", found[1]).exit_code == 0
