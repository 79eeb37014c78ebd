"""Exhaustive search: same answer as scoring the whole enumeration at once, independent of
workers and chunk size, deterministic ties, CSV, infeasible problems, CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import plain
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.evaluate import evaluate, evaluate_arrays
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.search.brute import scan
from solver.search.distinct import top_groups
from solver.cli.app import cli
from solver.space.count import count_mappings
from solver.space.enumerate import enumerate_all
from solver.space.declaration import SPACES

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "problems" / "systems" / "h100-80g-nvl8.yaml"
SMALL = Model(name="small", hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128,
              num_blocks=6)
SMALL_YAML = "name: small\nhidden: 2048\nfeedforward: 8192\nseq_size: 2048\nattn_heads: 16\nattn_size: 128\nnum_blocks: 6\n"
GPUS, CAP = 4, 8    # 152,608 mappings in FULL (13,045 feasible): small enough to score all at once in ~200 MB
FULL = plain(SPACES["full"])   # the K/V ring and the whole group, as before cp_comm and hybrid sharding
HBM_GIB = 4         # 2 GiB usable beside the system's 2 GiB runtime reserve (costmodel.inputs.system.RUNTIME_RESERVE_GIB)
NVLINK_SIZE = 2     # 4 GPUs span two NVLink domains: with 2 GiB of usable HBM both network and HBM checks bind


@pytest.fixture(scope="module")
def h100():
    return load_system(H100).with_overrides(offload_gib=64, offload_gbps=100, hbm_gib=HBM_GIB, nvlink_size=NVLINK_SIZE)


@pytest.fixture(scope="module")
def reference(h100):
    """The whole space of a small problem scored in one call, sorted by (time, ordinal)."""
    arrays = enumerate_all(SMALL, h100, GPUS, CAP, FULL)
    result = evaluate_arrays(SMALL, h100, arrays, Datatype.float8)
    feasible = np.flatnonzero(result.feasible)
    order = feasible[np.lexsort((feasible, result.iteration_time_s[feasible]))]
    return arrays, result, order


def test_brute_matches_scoring_everything_at_once(h100, reference) -> None:
    arrays, result, order = reference
    found = scan(SMALL, h100, GPUS, CAP, FULL, Datatype.float8, top_k=7, workers=1)
    assert found.evaluated == len(arrays) == count_mappings(SMALL, h100, GPUS, CAP, FULL).mappings
    assert found.feasible == int(result.feasible.sum())
    assert 0 < found.feasible < found.evaluated, "the test problem should have feasible and infeasible mappings"
    assert {"hbm_capacity", "dp_network"} <= set(found.blocked)
    # distinct top 7: the first-enumerated of each group of mappings with the same skeleton,
    # time and memory (settings without effect), taken in (time, ordinal) order
    firsts, seen = [], set()
    for i in order.tolist():
        key = (*(int(arrays.columns[n][i]) for n in ("tp", "pp", "dp", "batch", "interleaving", "microbatch")),
               float(result.iteration_time_s[i]), float(result.hbm_bytes[i]), float(result.offload_bytes[i]))
        if key not in seen:
            seen.add(key)
            firsts.append(i)
    assert [c.ordinal for c in found.top] == firsts[:7]
    for c in found.top:
        assert c.mapping == arrays.to_mapping(c.ordinal, Datatype.float8)
        assert c.iteration_time_s == pytest.approx(float(result.iteration_time_s[c.ordinal]), rel=1e-12)
    times = [c.iteration_time_s for c in found.top]
    assert times == sorted(times)
    for name, values in found.feasible_by_dimension.items():
        assert sum(values.values()) == found.feasible, name


def test_best_agrees_with_the_scalar_evaluator(h100) -> None:
    found = scan(SMALL, h100, GPUS, CAP, FULL, Datatype.float8, top_k=3, workers=1)
    scalar = evaluate(SMALL, h100, found.best.mapping)
    assert scalar.feasible
    assert scalar.iteration_time_s == pytest.approx(found.best.iteration_time_s, rel=1e-9)
    assert scalar.hbm_bytes == pytest.approx(found.best.memory["hbm_bytes"], rel=1e-9)
    assert sum(found.best_time_breakdown_s.values()) == pytest.approx(found.best.iteration_time_s, rel=1e-6)


def test_independent_of_workers_and_chunk_size(h100) -> None:
    one = scan(SMALL, h100, GPUS, CAP, SPACES["calculon-2023"], Datatype.bfloat16, top_k=20, workers=1)
    two = scan(SMALL, h100, GPUS, CAP, SPACES["calculon-2023"], Datatype.bfloat16, top_k=20, workers=2, chunk_rows=7_777)
    assert (one.evaluated, one.feasible) == (two.evaluated, two.feasible)
    assert [c.to_dict() for c in one.top] == [c.to_dict() for c in two.top]
    assert one.feasible_by_dimension == two.feasible_by_dimension


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=60), st.integers(0, 12), st.randoms(use_true_random=False))
def test_top_indices_break_ties_by_ordinal(times, k, rnd) -> None:
    # every mapping its own group (distinct keys): the top groups are the top mappings
    time_s = np.array(times, dtype=float)
    ordinal = np.array(rnd.sample(range(1000), len(times)), dtype=np.int64)
    keys = np.arange(len(times), dtype=np.int64)[:, None]
    expected = np.lexsort((ordinal, time_s))[:k] if k else np.zeros(0, dtype=np.int64)
    assert [int(g[0]) for g in top_groups(time_s, ordinal, keys, k)] == expected.tolist()


def test_csv_holds_every_feasible_mapping(h100, reference, tmp_path: Path) -> None:
    arrays, result, _ = reference
    path = tmp_path / "all.csv"
    found = scan(SMALL, h100, GPUS, CAP, FULL, Datatype.float8, top_k=1, workers=2, chunk_rows=7_000,
                 csv_path=path)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == found.feasible
    ordinals = [int(r["ordinal"]) for r in rows]
    assert ordinals == sorted(ordinals) == np.flatnonzero(result.feasible).tolist()
    row = rows[len(rows) // 2]
    i = int(row["ordinal"])
    assert float(row["iteration_time_s"]) == pytest.approx(float(result.iteration_time_s[i]), rel=1e-8)
    assert int(row["tensor_par"]) == arrays.tp[i] and int(row["microbatch_size"]) == arrays.microbatch[i]
    assert row["activation_recompute"] == arrays.to_mapping(i, Datatype.float8).activation_recompute.value


def test_nothing_fits_is_reported_with_the_checks() -> None:
    big = Model(name="big", hidden=12288, feedforward=49152, seq_size=2048, attn_heads=96, attn_size=128,
                num_blocks=96)
    no_offload = load_system(H100)  # 80 GiB HBM, no offload tier
    found = scan(big, no_offload, 2, 64, FULL, Datatype.bfloat16, workers=1)
    assert found.best is None and found.feasible == 0 and found.evaluated > 0
    reason = found.infeasible_reason(no_offload.hbm.capacity_bytes)
    assert "hbm_capacity" in reason and "80.0 GiB" in reason


# ---------------------------------------------------------------- CLI
def small_model_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_YAML)
    return path


def test_cli_brute_json(tmp_path: Path) -> None:
    problem = ["--model", str(small_model_file(tmp_path)), "--system", str(H100), "--offload-gib", "64",
               "--hbm-gib", str(HBM_GIB), "--nvlink-size", str(NVLINK_SIZE), "--gpus", str(GPUS), "--max-batch",
               str(CAP), "--datatype", "float8", "--fix", "cp_comm=p2p", "--fix", "shard=all"]
    result = CliRunner().invoke(cli, ["brute", *problem, "--top-k", "3", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {"best", "top", "evaluated", "feasible", "seconds"} <= set(data)
    assert {"mapping", "iteration_time_s", "mfu", "memory"} <= set(data["best"])
    assert data["best"]["mapping"]["num_procs"] == GPUS and len(data["top"]) == 3
    assert data["top"][0]["iteration_time_s"] == data["best"]["iteration_time_s"] <= data["top"][2]["iteration_time_s"]
    counted = CliRunner().invoke(cli, ["count", *problem, "--feasible", "--workers", "1", "--json"])
    assert counted.exit_code == 0, counted.output
    assert json.loads(counted.output)["feasible"] == data["feasible"]


def test_cli_brute_table(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["brute", "--model", str(small_model_file(tmp_path)), "--system", str(H100),
                                      "--gpus", "8", "--max-batch", "32", "--top-k", "2", "--workers", "1",
                                      "--fix", "cp_comm=p2p", "--fix", "shard=all"])
    assert result.exit_code == 0, result.output
    assert "Best mapping" in result.output and "Top 2" in result.output


def test_cli_brute_infeasible_exits_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["brute", "--model", str(small_model_file(tmp_path)), "--system", str(H100),
                                      "--gpus", "256", "--max-batch", "2", "--workers", "1",
                                      "--fix", "cp=1"])
    assert result.exit_code == 1
    assert "no mapping exists" in result.output and "Traceback" not in result.output


def test_cli_brute_unknown_datatype_for_system(tmp_path: Path) -> None:
    selene = ROOT / "problems" / "systems" / "a100-80g-selene.yaml"
    result = CliRunner().invoke(cli, ["brute", "--model", str(small_model_file(tmp_path)), "--system", str(selene),
                                      "--gpus", "8", "--datatype", "float8"])
    assert result.exit_code == 1
    assert "float8" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("gpus", ["0", "-1", "many"])
def test_cli_brute_bad_gpus(tmp_path: Path, gpus: str) -> None:
    result = CliRunner().invoke(cli, ["brute", "--model", str(small_model_file(tmp_path)), "--system", str(H100),
                                      "--gpus", gpus])
    assert result.exit_code == 2 and "--gpus" in result.output


def test_cli_brute_help_has_an_example() -> None:
    result = CliRunner().invoke(cli, ["brute", "--help"])
    assert result.exit_code == 0 and "Example" in result.output and "--top-k" in result.output
