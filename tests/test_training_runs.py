"""Measured training runs: reading the three run-file formats, the published rows' step time
and configurations, the mapping of a run onto this tool's inputs, and `mapsat validate
--runs` through click's CliRunner, with one-line errors for bad run files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from costmodel.space.choices import Recompute, TPComm, TPOverlap
from costmodel.errors import InputError
from costmodel.inputs.load import load_model, load_system, read_document
from costmodel.measured.run_bridge import (BridgeRow, bridge_configuration, bridge_step_time_s, load_workload_settings,
                                  published_configuration)
from costmodel.measured.run_files import read_runs, run_file_format
from costmodel.measured.run_mapping import map_run
from costmodel.ops import ScalarOps
from costmodel.space.layout import stage_blocks
from costmodel.measured.run_scoring import RunInputs, held_out_splits, newest_per_configuration, score_runs, split_dense
from costmodel.measured.runs import Precision, Run, software_order
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from tests.conftest import MODELS_DIR, PROBLEMS, SYSTEMS_DIR

RUNS_DIR = PROBLEMS / "runs"
BRIDGE = RUNS_DIR / "megatron-bridge-pretraining.json"
SINGLE_GPU = RUNS_DIR / "h200-single-gpu-pytorch.json"
SHARED = PROBLEMS.parent.parent / "shared" / "validation" / "training-runs"
DENSE_KEYS = ("llama3_8b", "llama3_70b", "llama31_405b")


@pytest.fixture(scope="module")
def bridge_rows() -> list[BridgeRow]:
    return [BridgeRow.model_validate(record) for record in read_document(BRIDGE)]


@pytest.fixture(scope="module")
def bridge_runs() -> tuple[Run, ...]:
    return read_runs(BRIDGE)


def by_name(runs, name: str) -> Run:
    return next(run for run in runs if run.name == name)


# ---- the published rows, read as they are


def test_the_bridge_file_reads_whole(bridge_runs):
    assert run_file_format(read_document(BRIDGE)) == "megatron-bridge"
    assert len(bridge_runs) == 96
    assert sum(run.step_time_s is None for run in bridge_runs) == 1  # DeepSeek-V3 H100 blockwise: no throughput


def test_configurations_as_the_readme_counts_them_and_as_setups(bridge_rows):
    """58 (37 dense) is the cells verbatim, the data README's count; the setups, with 'n/a' read as
    1 and a missing FSDP column as 0, are 51 (31 dense)."""
    dense = [row for row in bridge_rows if row.model_key in DENSE_KEYS]
    assert len({published_configuration(row) for row in bridge_rows}) == 58
    assert len({published_configuration(row) for row in dense}) == 37
    assert len({bridge_configuration(row) for row in bridge_rows}) == 51
    assert len({bridge_configuration(row) for row in dense}) == 31


def test_step_time_of_a_row_by_hand(bridge_runs):
    # bridge260401_llama3_70b_h100_fp8cs_64: GBS 256, seq 8192, 1664 tokens/s/GPU on 64 GPUs:
    # 256 · 8192 = 2,097,152 tokens per step; 1664 · 64 = 106,496 tokens/s; 19.6923 s.
    run = by_name(bridge_runs, "bridge260401_llama3_70b_h100_fp8cs_64")
    assert run.step_time_s == pytest.approx(19.6923, rel=1e-5)
    assert bridge_step_time_s(256, 8192, 1664.0, 64) == pytest.approx(2_097_152 / 106_496)
    assert (run.tp, run.pp, run.cp, run.dp, run.interleaving) == (4, 8, 1, 2, 5)
    assert run.precision is Precision.fp8_tensorwise and run.precision_stated


def test_workload_settings_reach_the_rows(bridge_runs):
    settings = load_workload_settings()
    assert all(settings[run.name].rows for run in bridge_runs if run.name in settings)
    fsdp = by_name(bridge_runs, "bridge260401_llama3_70b_gb200_fp8cs_64")
    assert (fsdp.megatron_fsdp, fsdp.sharding_stage, fsdp.microbatch, fsdp.activation_offload_blocks) == (True, 3, 2, 40)
    graphs = by_name(bridge_runs, "bridge2511_llama3_8b_gb200_fp8cs_8")
    assert graphs.cuda_graphs == "full-iteration"
    # 25.11's 405B GB200 preset is FSDP on 128 GPUs, the table's row tp 4, pp 16 on 256: not applied
    other = by_name(bridge_runs, "bridge2511_llama31_405b_gb200_fp8cs_256")
    assert other.activation_offload_blocks == 0 and not other.megatron_fsdp and "not applied" in other.notes
    # every release's performance scripts set grad_reduce_in_fp32 false, whatever the preset: BF16
    # gradients on every row with settings, a preset that does not apply included
    assert all(run.grad_datatype == "16bit" for run in bridge_runs if run.name in settings)
    assert other.grad_datatype == "16bit"
    # the table's MBS cell (2) contradicts the row's GA (16 = 128 / (MBS · 8)); the preset's mbs 1 agrees with GA
    altquant = by_name(bridge_runs, "bridge2509_llama3_70b_gb200_64_altquant")
    assert (altquant.microbatch, altquant.tp, altquant.pp, altquant.interleaving) == (1, 2, 4, 5)
    assert altquant.global_batch // (altquant.microbatch * altquant.dp) == 16
    inferred = by_name(bridge_runs, "bridge2509_llama3_8b_h100_8")
    assert inferred.precision is Precision.fp8_tensorwise and not inferred.precision_stated


def test_newest_release_of_each_configuration(bridge_runs):
    assert software_order("26.04.01") > software_order("26.04") > software_order("25.11")
    newest, older = newest_per_configuration(bridge_runs)
    assert len(newest) == 51 and len(newest) + len(older) == 96
    names = {run.name for run in newest}
    assert "bridge2606_llama31_405b_gb200_fp8cs_256" in names
    assert "bridge260401_llama31_405b_gb200_fp8cs_256" not in names
    assert "bridge260401_llama3_70b_gb200_fp8cs_64" in names and "bridge2604_llama3_70b_gb200_fp8cs_64" not in names


# Dense rows the model calls infeasible on memory: none. Llama 3 70B on 64 GB200 (Megatron-FSDP, 40 of
# 80 blocks' activations offloaded) keeps the 40 kept blocks and one offloaded block in transit, 183.1
# GiB of 186 (costmodel.terms.stage_state.TRANSIT_BLOCKS); 25.09's Llama 3 70B MXFP8 on 64 GB200 ran its
# preset at mbs 1, as its own GA cell says (problems/runs/megatron-bridge-workload-settings.yaml).
MEMORY_BOUND_ROWS: dict[str, str] = {}


def test_every_dense_row_is_scored_or_bound_by_memory_it_cannot_express(bridge_runs):
    inputs = RunInputs()
    dense, other = split_dense(bridge_runs, inputs)
    assert len(dense) == 58 and len(other) == 38
    scores = score_runs(dense, inputs)
    bound = {s.run.name: s.reasons for s in scores if s.status != "scored"}
    assert set(bound) == set(MEMORY_BOUND_ROWS), bound
    for name, reasons in bound.items():
        assert len(reasons) == 1 and reasons[0].startswith(MEMORY_BOUND_ROWS[name] + ":"), (name, reasons)
    assert {s.status for s in scores} <= {"scored", "infeasible"}
    assert all(s.predicted_step_s > 0 and s.time_error is not None for s in scores)


def test_the_project_copies_equal_the_shared_files():
    if not SHARED.is_dir():
        pytest.skip("the shared validation data is not beside this clone")
    for name in ("megatron-bridge-pretraining.json", "megatron-bridge-models.json", "h200-single-gpu-pytorch.json"):
        assert (RUNS_DIR / name).read_bytes() == (SHARED / name).read_bytes(), name


# ---- single-GPU iterations


def test_the_single_gpu_file_reads_with_its_shapes():
    runs = read_runs(SINGLE_GPU)
    assert len(runs) == 34
    run = by_name(runs, "llama-1b-mb2-full")
    assert (run.num_gpus, run.global_batch, run.microbatch, run.recompute) == (1, 8, 2, "full")
    assert run.model.mlp == "swiglu" and run.model.kv_heads == 8 and run.peak_memory_bytes > 0
    scores = score_runs(runs)
    assert all(s.status == "scored" and s.memory_error is not None for s in scores)


# ---- a run as this tool's inputs


def test_a_run_maps_onto_the_nearest_mapping():
    model = load_model(MODELS_DIR / "llama-3.1-70b" / "config.json", seq_size=8192)
    system = load_system(SYSTEMS_DIR / "h100-80g-nvl8.yaml")
    run = Run(name="r", model="llama-3.1-70b", system="h100-80g-nvl8", num_gpus=64, seq_size=8192, global_batch=256,
              tp=4, pp=8, interleaving=5, tp_comm_overlap=True, recompute="full", recompute_blocks=1,
              cuda_graphs="per-layer", precision=Precision.mxfp8, step_time_s=20.0)
    mapped = map_run(run, model, system)
    m = mapped.mapping
    assert (m.tp, m.pp, m.dp, m.pipeline_interleaving, m.batch_size) == (4, 8, 2, 5, 256)
    assert m.tensor_par_comm_type is TPComm.rs_ag and m.tensor_par_overlap is TPOverlap.ring
    assert m.activation_recompute is Recompute.full and m.recompute_blocks == 1   # 1 of a chunk's 2 blocks
    assert (m.tensor_par_net, m.pipeline_par_net, m.data_par_net) == (0, 1, 1)
    # the recipe itself, in bfloat16 (costmodel.inputs.precision), no longer a gap
    assert mapped.datatype is Datatype.bfloat16 and m.precision is Precision.mxfp8
    gaps = " | ".join(mapped.not_expressible)
    assert "precision" not in gaps
    assert "recompute" not in gaps                    # recompute_blocks says it
    assert "CUDA graphs" not in gaps and m.cuda_graphs == "per-layer"   # expressible: graphed kernels lose the gap


# ---- mapsat validate --runs


def write_runs(tmp_path: Path, runs: list[dict] | dict, name: str = "runs.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(runs if isinstance(runs, dict) else {"runs": runs}))
    return str(path)


RUN = {"name": "llama8b-h100", "model": "llama-3.1-8b", "system": "h100-80g-nvl8", "num_gpus": 8,
       "seq_size": 8192, "global_batch": 128, "microbatch": 1, "recompute": "full", "precision": "bf16",
       "step_time_s": 10.0, "source": "a test"}


def validate(*args: str):
    return CliRunner().invoke(cli, ["validate", *args], prog_name="mapsat")


def test_validate_runs_prints_a_table_and_a_summary(tmp_path):
    path = write_runs(tmp_path, [RUN, {**RUN, "name": "llama8b-h100-tp2", "tp": 2, "step_time_s": 8.0}])
    result = validate("--runs", path)
    assert result.exit_code == 0, result.output
    assert "llama8b-h100-tp2" in result.output and "median |error|" in result.output


def test_validate_runs_json_and_a_system_replaced(tmp_path):
    path = write_runs(tmp_path, [RUN])
    plain = json.loads(validate("--runs", path, "--json").output)
    assert plain["summary"]["step_time"][0]["count"] == 1
    [row] = plain["runs"]
    assert row["status"] == "scored" and row["time_error"] == pytest.approx(row["predicted_step_s"] / 10.0 - 1)
    other = validate("--runs", path, "--json", "--system",
                     f"h100-80g-nvl8={SYSTEMS_DIR / 'h100-80g-nvl8-paper2023.yaml'}")
    assert other.exit_code == 0, other.output
    assert json.loads(other.output)["runs"][0]["system"] == "h100-80g-nvl8-paper2023"


def test_model_and_system_files_are_relative_to_the_run_file(tmp_path):
    inner = tmp_path / "sub"
    inner.mkdir()
    model = os.path.relpath(MODELS_DIR / "llama-3.1-8b" / "config.json", inner)
    system = os.path.relpath(SYSTEMS_DIR / "h100-80g-nvl8.yaml", inner)
    path = inner / "runs.json"
    path.write_text(json.dumps([{**RUN, "model": model, "system": system}]))
    [loaded] = read_runs(path)
    assert Path(loaded.model) == (MODELS_DIR / "llama-3.1-8b" / "config.json").resolve()
    [score] = score_runs([loaded])
    assert score.status == "scored" and score.system_name == "h100-80g-nvl8"


@pytest.mark.parametrize("runs, expected", [
    ([{**RUN, "tp": 0}], "run 1 (llama8b-h100): field 'tp' 0: Input should be greater than 0"),
    ([{**RUN, "tpp": 2}], "run 1 (llama8b-h100): unknown field 'tpp'"),
    ([{k: v for k, v in RUN.items() if k != "seq_size"}], "run 1 (llama8b-h100): missing field 'seq_size'"),
    ([{**RUN, "tp": 3}], "tp(3)·cp(1)·pp(1)=3 does not divide num_gpus(8)"),
    ([{**RUN, "global_batch": 100}], "global_batch(100) is not a multiple of dp(8)·microbatch(1) = 8"),
    ([{**RUN, "precision": "fp6"}], "field 'precision' 'fp6'"),
    ([RUN, RUN], "run 2 (llama8b-h100): name 'llama8b-h100' is given twice (runs 1 and 2)"),
    ({"run": [RUN]}, "unknown field 'run'"),
])
def test_bad_run_files_are_one_line_errors(tmp_path, runs, expected):
    path = write_runs(tmp_path, runs)
    result = validate("--runs", path)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), result.output
    assert expected in lines[0], lines[0]


def test_a_bad_bridge_row_names_the_row_and_field(tmp_path):
    records = read_document(BRIDGE)[:3]
    records[1] = {**records[1], "gbs": "many"}
    path = tmp_path / "bridge.json"
    path.write_text(json.dumps(records))
    with pytest.raises(InputError, match=r"bridge\.json: row 2 \(bridge2608_gpt_oss_120b_gb200_mxfp8_64\): "
                                         r"field 'gbs' 'many'"):
        read_runs(path)


def test_an_unknown_model_name_is_reported_not_raised(tmp_path):
    path = write_runs(tmp_path, [{**RUN, "model": "no-such-model"}])
    result = validate("--runs", path, "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)["runs"]
    assert row["status"] == "not_modelled" and "no-such-model" in row["reasons"][0]


def test_the_example_run_file_says_what_the_published_rows_say(bridge_runs):
    """problems/runs/example.yaml writes two published rows in this project's format: both
    readings agree field by field but for the name and the notes."""
    example = read_runs(RUNS_DIR / "example.yaml")
    for run, row in zip(example, ("bridge260401_llama3_70b_h100_fp8cs_64", "bridge260401_llama3_70b_gb200_fp8cs_64")):
        published = by_name(bridge_runs, row)
        differ = {key for key, value in run.model_dump().items() if value != getattr(published, key)}
        assert differ == {"name", "notes"}, differ


def test_held_out_splits_leave_out_whole_configurations(bridge_runs):
    dense, _ = split_dense(bridge_runs, RunInputs())
    folds = list(held_out_splits(dense, lambda run: run.configuration_key))
    assert len(folds) == 31
    for group, train, test in folds:
        assert test and all(run.configuration_key == group for run in test)
        assert all(run.configuration_key != group for run in train) and len(train) + len(test) == 58
    assert [group for group, _, _ in held_out_splits(dense, lambda run: run.system)] == [
        "gb200-186g-nvl72", "h100-80g-nvl8", "b200-180g-nvl8"]


# ---- mixture-of-experts rows as they ran (megatron-bridge-workload-settings.yaml, cited per row)

def _bridge_run(name: str) -> Run:
    return {run.name: run for run in read_runs(BRIDGE)}[name]


def test_moe_rows_read_what_the_presets_set():
    # v0.6.0 perf_recipes/deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_fp8mx_config with
    # common.py _enable_deepseek_full_iteration_mxfp8: HybridEP flex dispatch, EP overlap, full-iteration
    # graphs, mla_up_proj recompute, expert_tensor_parallel_size 1 (the table's etp cell is empty),
    # grad_reduce_in_fp32 False (perf_recipes/_common.py); the layout_map entry for pp 4 × vp 4.
    run = _bridge_run("bridge2608_deepseek_v3_gb200_mxfp8_256")
    assert (run.etp, run.moe_dispatcher, run.moe_comm_overlap, run.cuda_graphs) == (1, "flex", True, "full-iteration")
    assert (run.recompute, run.recompute_modules, run.grad_datatype) == ("selective", ("mla_up_proj",), "16bit")
    assert run.pipeline_layout == "Et*4|(t*4|)*14tmL"
    model = load_model(MODELS_DIR / "deepseek-v3" / "config.json", seq_size=run.seq_size)
    mapped = map_run(run, model, load_system(SYSTEMS_DIR / "gb200-186g-nvl72.yaml"))
    # 16 chunks of 4 blocks round 4 ranks; the last chunk holds 1 block, the MTP module and the
    # loss: 16, 16, 16, 13, the layout rule's own (a short last chunk), so no stated layout
    assert (mapped.mapping.pipeline_first_stage_blocks, mapped.mapping.pipeline_last_stage_blocks) == (None, None)
    assert stage_blocks(ScalarOps, 61.0, 4.0, interleaving=4.0) == (16.0, 16.0, 13.0)
    assert mapped.mapping.expert_tensor_par == 1 and mapped.mapping.moe_dispatcher == "flex"
    # GPT-OSS on GB200 in BF16 at v0.4.2: no flex backend, alltoall, the EP overlap on (moe_a2a_overlap)
    oss = _bridge_run("bridge260401_gpt_oss_120b_gb200_bf16_64")
    assert (oss.moe_dispatcher, oss.moe_comm_overlap, oss.recompute_modules) == ("alltoall", True,
                                                                                 ("layernorm", "moe_act"))


def test_flex_rows_carry_their_dispatchers_sm_share():
    # HybridEP at 32 SMs (Megatron-Bridge overrides.py; the 26.08 GPT-OSS settings) of a GB200's
    # 148; DeepEP at Megatron-LM's default 20 of a B200's 148 and an H100's 132; the all-to-all
    # dispatcher and runs without the EP overlap keep the network's usage (None).
    expected = {"bridge2608_deepseek_v3_gb200_mxfp8_256": 32 / 148, "bridge2608_gpt_oss_120b_gb200_mxfp8_64": 32 / 148,
                "bridge260401_deepseek_v3_b200_mxfp8_256": 20 / 148, "bridge2509_deepseek_v3_h100_1024": 20 / 132,
                "bridge260401_gpt_oss_120b_gb200_bf16_64": None, "bridge2604_deepseek_v3_b200_mxfp8_256": None}
    for name, share in expected.items():
        run = _bridge_run(name)
        assert run.moe_dispatcher_sm_share == (None if share is None else pytest.approx(share)), name


def test_rows_without_mtp_cost_the_model_without_it():
    run = _bridge_run("bridge2511_deepseek_v3_gb200_bf16_256_nomtp")     # the table's "DeepSeekV3 (w/o MTP)"
    assert run.mtp_blocks == 0 and RunInputs().model(run).mtp_blocks == 0
    with_mtp = _bridge_run("bridge2511_deepseek_v3_b200_mxfp8_256_mtp")
    assert with_mtp.mtp_blocks is None and RunInputs().model(with_mtp).mtp_blocks == 1


def test_moe_section_leaves_out_token_dropping_and_flags_the_unlayable_row():
    import sys
    sys.path.insert(0, str(PROBLEMS.parent / "benchmarks"))
    from bench_training_runs import moe_bridge_report
    report, left_out = moe_bridge_report(RunInputs())
    names = {s.run.name for s in report.newest + report.older}
    dropping = {r["id"] for r in json.loads(BRIDGE.read_text()) if r.get("moe_token_dropping")}
    assert len(dropping) == 4 and not dropping & names and dropping <= set(left_out)
    assert "flagged" in left_out["bridge2509_deepseek_v3_gb200_256_altquant"]
    assert {s.run.model for s in report.newest} == {"deepseek-v3", "gpt-oss-120b"}


def test_25_09s_deepseek_v3_rows_train_without_the_load_balancing_loss():
    """Megatron-Bridge r0.1.0's DeepSeekV3Provider sets seq_aux_loss but no coefficient (Megatron-Core's
    0.0: the router skips the loss); from 25.11 the provider and the bridge set 1e-4."""
    old = _bridge_run("bridge2509_deepseek_v3_h100_1024")
    assert old.router_load_balancing == "none" and RunInputs().model(old).router_load_balancing == "none"
    new = _bridge_run("bridge2511_deepseek_v3_b200_mxfp8_256_mtp")
    assert new.router_load_balancing is None and RunInputs().model(new).router_load_balancing == "seq_aux_loss"
