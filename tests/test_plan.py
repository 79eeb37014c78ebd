"""`mapsat plan`: the failure arithmetic against hand computations (Young 1974), goodput
against the failure rate, the plan against `solve` and against brute force over the count
list, the phases file's errors, and which count a deadline or a budget picks."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from conftest import REPO
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from costmodel.terms.training_cost import LLAMA3_FAILURE_RATE_PER_GPU_HOUR, Failures, failures, run_cost
from solver.cli.app import cli
from solver.search.brute import scan
from solver.search.plan import CountPlan, Phase, Settings, Target, choose, parse_counts, plan
from solver.search.solve import SolverConfig, solve
from solver.space.declaration import get_space

H100 = load_system(REPO / "problems/systems/h100-80g-nvl8.yaml")
SMALL = Model(name="small", hidden=1024, feedforward=4096, seq_size=2048, attn_heads=16, attn_size=64, num_blocks=8)
SETTINGS = Settings(LLAMA3_FAILURE_RATE_PER_GPU_HOUR, 2000.0, False, 48.0, 10.0)


# ---- the arithmetic ----

def test_llama3_failure_rate_is_the_papers_figures():
    # Dubey et al. 2024, §3.3.4, Table 5: 419 unexpected interruptions in 54 days on 16,384 GPUs
    assert LLAMA3_FAILURE_RATE_PER_GPU_HOUR == pytest.approx(419 / (54 * 24 * 16384), rel=1e-12)
    assert LLAMA3_FAILURE_RATE_PER_GPU_HOUR == pytest.approx(1.97e-5, rel=0.005)


def test_young_interval_and_lost_fraction_by_hand():
    # 1000 GPUs at 1e-4 failures per GPU-hour: M = 10 h = 36,000 s. State 200 GB at 2 GB/s:
    # δ = 100 s. τ = sqrt(2·100·36000) = sqrt(7.2e6) = 2683.2816 s; restart 10 min = 600 s.
    # f = 100/2683.2816 + (1341.6408 + 600)/36000 = 0.0372678 + 0.0539345 = 0.0912023
    f = failures(1000, 200e9, failure_rate_per_gpu_hour=1e-4, checkpoint_gbps=2.0, restart_minutes=10.0)
    assert f.mtbf_s == pytest.approx(36000.0, rel=1e-12)
    assert f.checkpoint_stall_s == pytest.approx(100.0, rel=1e-12)
    assert f.interval_s == pytest.approx(2683.2816, rel=1e-7)
    assert f.lost_fraction == pytest.approx(0.0912023, rel=1e-6)
    assert f.goodput == pytest.approx(0.9087977, rel=1e-6)
    cost = run_cost(1000, 86400.0, f, gpu_power_w=700.0, pue=1.2, gpu_hour_price_usd=2.0)
    wall = 86400.0 / 0.9087977                      # one failure-free day, stretched by goodput
    assert cost.wall_s == pytest.approx(wall, rel=1e-6)
    assert cost.gpu_hours == pytest.approx(1000 * wall / 3600, rel=1e-6)
    assert cost.interruptions == pytest.approx(1e-4 * 1000 * wall / 3600, rel=1e-6)
    assert cost.energy_j == pytest.approx(1000 * 700 * wall * 1.2, rel=1e-6)
    assert cost.cost_usd == pytest.approx(2.0 * 1000 * wall / 3600, rel=1e-6)


def test_async_checkpoint_by_hand():
    # Async: stall = per-GPU share 200 GB / 1000 / 50 GB/s = 0.004 s; write 100 s runs behind.
    # τ = max(sqrt(2·0.004·36000), 100) = max(16.97, 100) = 100 s.
    # f = 0.004/100 + (50 + 100 + 600)/36000 = 0.00004 + 0.0208333 = 0.0208733
    f = failures(1000, 200e9, failure_rate_per_gpu_hour=1e-4, checkpoint_gbps=2.0, async_checkpoint=True,
                 snapshot_gbps=50.0, restart_minutes=10.0)
    assert f.checkpoint_stall_s == pytest.approx(0.004, rel=1e-12)
    assert f.interval_s == pytest.approx(100.0, rel=1e-12)
    assert f.lost_fraction == pytest.approx(0.0208733, rel=1e-5)


def test_goodput_falls_as_the_failure_rate_rises():
    rates = [0.0, 1e-7, 1e-6, 1e-5, 1.97e-5, 5e-5, 1e-4, 1e-3]
    for gpus in (8, 1024, 16384):
        goodputs = [failures(gpus, 5.7e12, failure_rate_per_gpu_hour=r).goodput for r in rates]
        assert goodputs[0] == 1.0
        assert all(a > b for a, b in zip(goodputs, goodputs[1:])), (gpus, goodputs)


def test_checkpoint_slower_than_failures_is_refused():
    with pytest.raises(Exception, match="checkpoint"):
        failures(16384, 5.7e12, failure_rate_per_gpu_hour=1e-3, checkpoint_gbps=0.1)


def test_counts_parse():
    assert parse_counts("16", 8) == [16]
    assert parse_counts("32,8,16,8", 8) == [8, 16, 32]
    assert parse_counts("8-32", 8) == [8, 16, 24, 32]
    assert parse_counts("1024-4096:1024", 8) == [1024, 2048, 3072, 4096]


# ---- the plan against solve and brute force ----

def test_plan_at_one_count_is_solves_best_time_exactly():
    phases = [Phase(tokens=1e9, seq_size=2048, batch=64)]
    result = plan(SMALL, H100, [16], phases, SETTINGS, max_batch=3072, space=get_space("full"))
    alone = solve(SMALL, H100, 16, max_batch=64, space=_pinned_batch(64), config=SolverConfig(top_k=1))
    row = result.counts[0]
    assert result.choice.rule == "the given count" and result.choice.plan is row
    assert row.phases[0].result.best.iteration_time_s == alone.best.iteration_time_s
    assert row.phases[0].result.certified_optimal
    assert row.phases[0].steps == pytest.approx(1e9 / (64 * 2048), rel=1e-12)
    assert row.cost.compute_s == pytest.approx(row.phases[0].steps * alone.best.iteration_time_s, rel=1e-12)


def _pinned_batch(batch: int):
    from solver.space.pins import pinned

    return pinned(get_space("full"), (("batch", (batch,)),))


def test_count_search_equals_brute_force_over_the_list():
    """Each count's best time in the plan equals brute force over every mapping at that count
    (1e-9), and the chosen (fastest) count is brute force's fastest: nothing skipped."""
    counts = [4, 8, 12, 16, 20, 24]   # 12 and 20: dp 20 takes batch 80 under the cap 96, not 96
    space = get_space("calculon-2023")
    phases = [Phase(tokens=1e9, seq_size=2048)]
    result = plan(SMALL, H100, counts, phases, SETTINGS, max_batch=96, space=space)
    brute = {}
    for n in counts:
        ref = scan(SMALL, H100, n, 96, space, Datatype.bfloat16, top_k=1, workers=1)
        brute[n] = ref.top[0].iteration_time_s if ref.top else None
    days = {}
    for row in result.counts:
        ref = brute[row.num_gpus]
        if ref is None:
            assert not row.feasible
            continue
        best = row.phases[0].result.best
        assert best.iteration_time_s == pytest.approx(ref, rel=1e-9, abs=0), row.num_gpus
        days[row.num_gpus] = row.cost.wall_s
    assert result.choice.plan.num_gpus == min(days, key=lambda n: (days[n], n))


# ---- choosing a count ----

def _row(gpus: int, wall_days: float, price_per_gpu_hour: float = 2.0) -> CountPlan:
    fail = Failures(0.0, gpus, math.inf, 0.0, 0.0, math.inf, 0.0, 0.0)
    cost = run_cost(gpus, wall_days * 86400, fail, gpu_hour_price_usd=price_per_gpu_hour)
    return CountPlan(gpus, [], fail, cost, 0.5)


ROWS = [_row(1024, 100.0), _row(2048, 52.0), _row(3072, 40.0), _row(4096, 27.0)]
# GPU-hours: 2.4576M, 2.5559M, 2.9491M, 2.6542M; cost at $2: 4.92M, 5.11M, 5.90M, 5.31M


def test_deadline_picks_the_cheapest_that_meets_it():
    choice = choose(ROWS, Target(deadline_days=60))
    assert choice.plan.num_gpus == 2048 and choice.rule == "cheapest within deadline"
    assert choose(ROWS, Target(deadline_days=45)).plan.num_gpus == 4096   # 3072 meets it but costs more
    missed = choose(ROWS, Target(deadline_days=20))
    assert missed.plan is None and "4,096 GPUs, takes 27.0 days > deadline 20" in missed.message


def test_budget_picks_the_fastest_within_it():
    assert choose(ROWS, Target(budget_usd=5.2e6)).plan.num_gpus == 2048
    assert choose(ROWS, Target(budget_usd=5.5e6)).plan.num_gpus == 4096
    assert choose(ROWS, Target(budget_usd=6e6, deadline_days=30)).plan.num_gpus == 4096
    missed = choose(ROWS, Target(budget_usd=1e6))
    assert missed.plan is None and "1,024 GPUs, costs $4,915,200 > budget $1,000,000" in missed.message


def test_no_target_picks_the_fastest_and_infeasible_rows_are_skipped():
    infeasible = CountPlan(8192, [], reason="phase all: no split")
    assert choose([*ROWS, infeasible], Target()).plan.num_gpus == 4096
    assert choose([infeasible], Target()).plan is None


# ---- the command ----

def _mapsat(*args):
    return CliRunner().invoke(cli, list(args))


MODEL_ARGS = ("--model", str(REPO / "problems/models/gpt-1.3b.yaml"), "--system",
              str(REPO / "problems/systems/h100-80g-nvl8.yaml"))


@pytest.mark.parametrize("content, fragment", [
    ({"phases": [{"tokens": -5, "seq_size": 2048}]}, "phases.0.tokens"),
    ({"phases": [{"tokens": 1e9, "seq_size": 2048, "batch_tokns": 4096}]}, "batch_tokns"),
    ({"phases": [{"tokens": 1e9, "seq_size": 2048, "batch_tokens": 3000}]}, "batch_tokens 3000"),
    ({"phases": [{"tokens": 1e9, "seq_size": "long"}]}, "phases.0.seq_size"),
    ({"phases": []}, "phases"),
])
def test_bad_phases_file_is_one_line_naming_the_field(tmp_path, content, fragment):
    path = tmp_path / "phases.json"
    path.write_text(json.dumps(content))
    result = _mapsat("plan", *MODEL_ARGS, "--gpus", "8", "--phases", str(path))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(path) in lines[0], result.output


def test_plan_command_json_and_plot(tmp_path):
    plot = tmp_path / "plan.png"
    result = _mapsat("plan", *MODEL_ARGS, "--gpus", "8,16", "--tokens", "1e9", "--batch", "64", "--json",
                     "--plot", str(plot), "--gpu-power-w", "700", "--gpu-hour-price", "2")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [c["num_gpus"] for c in doc["counts"]] == [8, 16]
    assert doc["chosen"] in (8, 16) and doc["rule"] == "fastest"
    assert plot.stat().st_size > 0


def test_budget_without_price_is_refused():
    result = _mapsat("plan", *MODEL_ARGS, "--gpus", "8", "--tokens", "1e9", "--budget", "1e6")
    assert result.exit_code == 1 and "--gpu-hour-price" in result.output


def test_a_missed_deadline_prints_the_table_then_one_error_line():
    result = _mapsat("plan", *MODEL_ARGS, "--gpus", "8,16", "--tokens", "1e12", "--batch", "64", "--days", "0.001")
    assert result.exit_code == 1
    assert "Per GPU count" in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: no GPU count qualifies: the fastest, 16 GPUs")


def test_tokens_disagreeing_with_the_phases_is_refused(tmp_path):
    path = tmp_path / "phases.yaml"
    path.write_text("phases:\n  - {tokens: 1.0e+9, seq_size: 2048, batch: 64}\n  - {tokens: 2.0e+9, seq_size: 2048}\n")
    result = _mapsat("plan", *MODEL_ARGS, "--gpus", "8", "--phases", str(path), "--tokens", "1e9")
    assert result.exit_code == 1 and "sum to 3e+09 tokens" in result.output


def test_a_count_that_is_not_whole_nvlink_domains_is_refused():
    result = _mapsat("plan", *MODEL_ARGS, "--gpus", "12", "--tokens", "1e9")
    assert result.exit_code == 1 and "--gpus 12: not a multiple of the" in result.output


def test_phases_of_one_sequence_and_batch_share_one_solve():
    phases = [Phase(name="a", tokens=1e9, seq_size=2048, batch=64), Phase(name="b", tokens=3e9, seq_size=2048, batch=64)]
    row = plan(SMALL, H100, [8], phases, SETTINGS, max_batch=3072, space=get_space("full")).counts[0]
    assert row.phases[0].result is row.phases[1].result
    assert row.phases[1].compute_s == pytest.approx(3 * row.phases[0].compute_s, rel=1e-12)
