"""The memory features a mapping file may state (costmodel.terms.memory_features): activation offload
of N blocks, full recompute of N blocks per chunk, per-module selective recompute and
Megatron-FSDP, each checked against a hand computation from the terms it refines."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from costmodel.errors import InputError
from costmodel.evaluate import _context_for, _scalar_fields, evaluate
from costmodel.terms.iteration import RESIDENT_BLOCKS, iteration_terms
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.ops import ScalarOps
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_scoring import (
    RunInputs,
    newest_per_configuration,
    score_runs,
    split_dense,
)
from tests.conftest import MODELS_DIR, PROBLEMS, SYSTEMS_DIR

REL = 1e-9
BRIDGE = PROBLEMS / "runs" / "megatron-bridge-pretraining.json"


@pytest.fixture(scope="module")
def llama70b():
    return load_model(MODELS_DIR / "llama-3.1-70b" / "config.json", seq_size=8192)


@pytest.fixture(scope="module")
def gb200():
    return load_system(SYSTEMS_DIR / "gb200-186g-nvl72.yaml")


@pytest.fixture(scope="module")
def h100():
    return load_system(SYSTEMS_DIR / "h100-80g-nvl8.yaml")


# Llama 3 70B on 64 GB200 as Megatron-Bridge 25.09 ran it: pp 1, dp 64, mb 2 (80 blocks a stage).
OFFLOADING = {"num_procs": 64, "tensor_par": 1, "pipeline_par": 1, "data_par": 64, "batch_size": 128,
              "microbatch_size": 2, "activation_recompute": "none", "tensor_par_comm_type": "ar",
              "sharding_stage": 3, "data_par_overlap": True, "activations_offload": True, "data_par_net": 1}
# Llama 3 70B on 64 H100: tp 4, pp 8, vp 5 (chunks of 2 blocks), full recompute.
RECOMPUTING = {"num_procs": 64, "tensor_par": 4, "pipeline_par": 8, "pipeline_interleaving": 5, "data_par": 2,
               "batch_size": 256, "microbatch_size": 1, "activation_recompute": "full",
               "tensor_par_comm_type": "rs_ag", "sharding_stage": 1, "pipeline_par_net": 1, "data_par_net": 1}


def terms(model, system, fields):
    mapping = Mapping.model_validate(fields)
    evaluate(model, system, mapping)                   # the checks a file gets
    return iteration_terms(_context_for(model, system, mapping), _scalar_fields(mapping), ScalarOps)


# ---- activation offload of N blocks


def test_offload_of_n_blocks_keeps_the_rest_in_hbm(llama70b, gb200):
    everything = terms(llama70b, gb200, OFFLOADING)
    half = terms(llama70b, gb200, {**OFFLOADING, "activation_offload_blocks": 40})
    activations = half.activations_bytes             # 80 blocks alive (pp 1), each `stored` bytes
    stored = activations / 80
    # (L - N)/L of the activations stay (the block computing among them), plus one offloaded
    # block in transit: Transformer Engine v2.8's schedule (layer_window_map, N = L/2) frees
    # offloaded layer 39 only when layer 79 commits, 41 layers' worth; TE >= 2.10 keeps L - N
    assert half.activations_hbm_bytes == pytest.approx((80 - 40 + 1) * stored, rel=REL)
    one_kept = terms(llama70b, gb200, {**OFFLOADING, "activation_offload_blocks": 79})
    assert one_kept.activations_hbm_bytes == pytest.approx(2 * stored, rel=REL)
    assert half.offload_bytes == pytest.approx(40 / 80 * activations, rel=REL)
    assert everything.activations_hbm_bytes == pytest.approx(RESIDENT_BLOCKS * stored, rel=REL)
    # offload traffic: N of L blocks offload, each exposing what its own compute cannot hide
    assert half.offload_s == pytest.approx(40 / 80 * everything.offload_s, rel=REL)
    # N = L is the flag alone
    all_blocks = terms(llama70b, gb200, {**OFFLOADING, "activation_offload_blocks": 80})
    assert (all_blocks.hbm_bytes, all_blocks.iteration_s) == (everything.hbm_bytes, everything.iteration_s)


# ---- full recompute of N blocks per chunk


def test_recompute_of_n_blocks_per_chunk(llama70b, h100):
    full = terms(llama70b, h100, {**RECOMPUTING, "seq_par_ag_redo": True})     # (gathered inputs redone alike)
    none = terms(llama70b, h100, {**RECOMPUTING, "activation_recompute": "none", "seq_par_ag_redo": True})
    one = terms(llama70b, h100, {**RECOMPUTING, "recompute_blocks": 1, "seq_par_ag_redo": True})
    share = 1 / 2                                           # 1 of each chunk's 80/(8·5) = 2 blocks
    # recompute time: N of K blocks add their forward (the fused kernel's own redo is always there)
    assert one.recompute_s - none.recompute_s == pytest.approx(share * (full.recompute_s - none.recompute_s), rel=REL)
    # stored: N of K blocks keep only their input, the others everything
    assert one.activations_bytes == pytest.approx(share * full.activations_bytes + (1 - share) * none.activations_bytes,
                                                  rel=REL)
    # the recomputed block's workspace is needed as soon as one block recomputes
    assert one.activation_workspace_bytes == full.activation_workspace_bytes > 0


# ---- per-module selective recompute


def test_core_attn_alone_is_attn_only(llama70b, h100):
    attn = {**RECOMPUTING, "activation_recompute": "attn_only", "fused_attention": False}
    plain = evaluate(llama70b, h100, Mapping.model_validate(attn))
    named = evaluate(llama70b, h100, Mapping.model_validate({**attn, "recompute_modules": ["core_attn"]}))
    assert named.iteration_time_s == plain.iteration_time_s and named.hbm_bytes == plain.hbm_bytes


def test_layernorm_and_mlp_modules_drop_their_stored_tensors(llama70b, h100):
    # bf16, no recipe, tp 4 with sequence parallelism, the all-gather kept (gathered GEMM inputs)
    base = {**RECOMPUTING, "activation_recompute": "attn_only"}
    plain = terms(llama70b, h100, base)
    norms = terms(llama70b, h100, {**base, "recompute_modules": ["core_attn", "layernorm"]})
    mlp = terms(llama70b, h100, {**base, "recompute_modules": ["core_attn", "mlp"]})
    alive = plain.activations_bytes / _stored_per_block(llama70b, 4)
    tokens, h, f, e = 1 * 8192, llama70b.hidden, llama70b.feedforward, 2.0
    # layernorm: the two norms' outputs, the gathered QKV and up-projection inputs, 2·e·T·h
    assert plain.activations_bytes - norms.activations_bytes == pytest.approx(alive * 2 * e * tokens * h, rel=REL)
    # mlp: SwiGLU's h→2f output and the gate's output, 3·e·T·f/t
    assert plain.activations_bytes - mlp.activations_bytes == pytest.approx(alive * 3 * e * tokens * f / 4, rel=REL)
    assert norms.recompute_s > plain.recompute_s and mlp.recompute_s > norms.recompute_s


def _stored_per_block(model, t):
    """Korthikanti et al. 2022 §4's bytes of one Llama block with a fused attention kernel,
    tp t with sequence parallelism, the gathered GEMM inputs kept, bf16, b = 1, s = 8192."""
    e, tokens, h, f = 2.0, 8192.0, model.hidden, model.feedforward
    d, a, g = model.attn_size, model.attn_heads, model.kv_groups
    norms_and_masks = (2 * e + (2 * 1.0 if model.dropout else 0.0)) * tokens * h / t   # masks with dropout only
    gemm_inputs = 2 * e * tokens * h
    qkv_proj = e * tokens * (a + 2 * g) * d / t + e * tokens * a * d / t
    mlp = 3 * e * tokens * f / t
    softmax_stats = 4.0 * a / t * tokens      # fp32 log-sum-exp per query and head
    return norms_and_masks + gemm_inputs + qkv_proj + mlp + softmax_stats


# ---- Megatron-FSDP


def test_megatron_fsdp_is_zero3_and_its_gradient_double_buffer(llama70b, gb200):
    zero3 = terms(llama70b, gb200, OFFLOADING)
    fsdp = terms(llama70b, gb200, {**OFFLOADING, "megatron_fsdp": True})
    one_block_grads = llama70b.block_params * 4.0         # fp32 main gradients, tp 1
    assert fsdp.sharding_buffer_bytes - zero3.sharding_buffer_bytes == pytest.approx(one_block_grads, rel=REL)
    assert fsdp.weights_bytes == zero3.weights_bytes and fsdp.iteration_s == zero3.iteration_s


# ---- files and errors


def test_a_mapping_file_round_trips_its_features():
    fields = {**OFFLOADING, "activation_offload_blocks": 40, "megatron_fsdp": True}
    mapping = Mapping.model_validate(fields)
    dumped = json.loads(json.dumps(mapping.model_dump(mode="json")))
    assert dumped["activation_offload_blocks"] == 40 and dumped["megatron_fsdp"] is True
    assert Mapping.model_validate(dumped) == mapping
    modules = Mapping.model_validate({**RECOMPUTING, "activation_recompute": "attn_only",
                                      "recompute_modules": ["layernorm", "mlp"]})
    assert Mapping.model_validate(json.loads(json.dumps(modules.model_dump(mode="json")))) == modules
    # left at their defaults, a mapping dumps as before (Calculon's fields only)
    plain = Mapping.model_validate(OFFLOADING).model_dump(mode="json")
    assert not {"activation_offload_blocks", "recompute_blocks", "recompute_modules", "megatron_fsdp"} & set(plain)


def test_more_blocks_than_a_stage_holds_is_one_line_naming_both(llama70b, gb200, h100):
    with pytest.raises(InputError, match=r"activation_offload_blocks\(81\) > the 80 blocks of a pipeline stage"):
        evaluate(llama70b, gb200, Mapping.model_validate({**OFFLOADING, "activation_offload_blocks": 81}))
    with pytest.raises(InputError, match=r"recompute_blocks\(3\) > the 2 blocks of a pipeline chunk"):
        evaluate(llama70b, h100, Mapping.model_validate({**RECOMPUTING, "recompute_blocks": 3}))
    with pytest.raises(ValidationError, match=r"recompute_blocks\(1\) needs activation_recompute full, not none"):
        Mapping.model_validate({**RECOMPUTING, "activation_recompute": "none", "recompute_blocks": 1})
    with pytest.raises(ValidationError, match=r"megatron_fsdp shards parameters: sharding_stage must be 3, not 1"):
        Mapping.model_validate({**RECOMPUTING, "megatron_fsdp": True})
    with pytest.raises(ValidationError, match="recompute_modules"):
        Mapping.model_validate({**RECOMPUTING, "activation_recompute": "attn_only", "recompute_modules": ["moe"]})


def test_the_mapping_cli_names_a_bad_feature_in_one_line(tmp_path):
    from click.testing import CliRunner

    from solver.cli.app import cli
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps({**OFFLOADING, "activation_offload_blocks": 81}))
    result = CliRunner().invoke(cli, ["eval", "--model", str(MODELS_DIR / "llama-3.1-70b" / "config.json"),
                                      "--system", str(SYSTEMS_DIR / "gb200-186g-nvl72.yaml"), "--mapping", str(path),
                                      "--seq-size", "8192"], prog_name="mapsat")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "activation_offload_blocks(81)" in result.output and "80 blocks" in result.output


# ---- the newest dense Megatron-Bridge rows


def _newest_dense_scores():
    inputs = RunInputs()
    newest, _ = newest_per_configuration(read_runs(BRIDGE))
    dense, _ = split_dense(newest, inputs)
    return score_runs(dense, inputs)


def test_every_newest_dense_bridge_row_is_feasible():
    # the 31 newest dense rows (one per configuration, NVFP4 in) all ran; the model calls none of them
    # infeasible, and none is left for want of a feature: their gaps name no offload, recompute or FSDP
    scores = _newest_dense_scores()
    assert len(scores) == 31
    assert {s.run.name: s.reasons for s in scores if s.status != "scored"} == {}
    gaps = " | ".join(g for s in scores for g in s.not_expressible)
    assert "offload" not in gaps and "Megatron-FSDP" not in gaps and "recompute" not in gaps
