"""Layer patterns: Nemotron-H and Nemotron 3 (Mamba-2, attention, MLP and MoE layers by
hybrid_override_pattern), Gemma 3 (sliding and global attention by sliding_window_pattern),
Llama 4 Scout (interleaved MoE with a shared expert) — their parameter counts against the model
cards, a Mamba-2 layer's FLOPs against the SSD paper's count, the degrees a Mamba layer allows,
and the readers' errors.

Counting rule (as tests/test_hf_models.py): every parameter of the checkpoint's text model,
the input embedding and the untied output layer each counted once (tied: once); "active" is
what one token uses (attention, Mamba, the router, the shared experts and k of the E routed
experts, embeddings and output layer included); `active_params_without_embedding` leaves the
input embedding out (a row lookup). Buffers that are not trained (the router's
e_score_correction_bias) are not counted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from costmodel.inputs.hf import UnmodelledFieldWarning
from costmodel.terms.block import block_forward_times
from costmodel.terms.block_memory import stored_activations
from costmodel.terms.context import Context, window_core_ratio
from costmodel.terms.pattern_layers import mamba_layer
from costmodel.errors import InputError
from costmodel.evaluate import _scalar_fields
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.precision import Precision
from costmodel.inputs.system import Datatype
from costmodel.ops import ScalarOps
from costmodel.inputs.mamba import (MambaShape, bridge_mamba_flops_per_token, mamba_allows,
                                   mamba_forward_flops_per_token, mamba_stored_bytes_per_token)

MODELS = Path(__file__).resolve().parents[1] / "problems" / "models"
H100 = load_system(MODELS.parent / "systems" / "h100-80g-nvl8.yaml")


def hf(name: str, seq: int = 8192) -> Model:
    return load_model(MODELS / name / "config.json", seq_size=seq)


# (model folder, published total, published active or None, relative tolerance of the total)
CARDS = [
    ("gemma-3-27b", 27.016e9, None, 0.005),       # Gemma 3 technical report Table 1: 1,416M embedding + 25,600M
    ("nemotron-3-nano-30b-a3b", 31.6e9, None, 0.005),   # NVIDIA: "3.2B active (3.6B with embeddings), 31.6B total"
]


@pytest.mark.parametrize("name,total,_active,tolerance", CARDS)
def test_total_parameters_match_the_model_card(name, total, _active, tolerance):
    assert hf(name).total_params == pytest.approx(total, rel=tolerance)


def test_nemotron_h_rounds_to_its_cards():
    """The Nemotron-H cards (huggingface.co/nvidia/Nemotron-H-8B-Base-8K, -56B-Base-8K: "This model has 56B model
    parameters"), NVIDIA's NGC page and the paper (arXiv:2504.03624) state whole billions only. Counted by the rule
    above (the embedding and the untied output layer once each) the configs give 8,100,852,736 and 56,324,350,464:
    they round to the cards' figures, 1.3 % and 0.58 % above them, which a whole-billion figure cannot settle
    closer. Without the output layer the 56B would be 55.25 B, which rounds to 55: its card counts it."""
    assert hf("nemotron-h-8b").total_params == 8_100_852_736
    model = hf("nemotron-h-56b")
    assert model.total_params == 56_324_350_464 and round(model.total_params / 1e9) == 56
    assert model.pattern_counts == {"M": 54, "*": 10, "-": 54}     # NVIDIA's project page: 54 Mamba-2, 54 MLP, 10 attention


def test_nemotron_3_nano_active_parameters_round_to_the_card():
    """NVIDIA's Nemotron 3 page: "3.2B active (3.6B with embeddings), 31.6B total": the active count with the
    embedding and output layer rounds to 3.6 B, without the input embedding to 3.2 B."""
    model = hf("nemotron-3-nano-30b-a3b")
    assert round(model.active_params / 1e9, 1) == 3.6
    assert round(model.active_params_without_embedding / 1e9, 1) == 3.2
    assert model.pattern_counts == {"M": 23, "*": 6, "E": 23}


# vision_config of huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json (the fields a count reads)
SCOUT_VISION = dict(hidden_size=1408, intermediate_size=5632, num_hidden_layers=34, image_size=336, patch_size=14,
                    num_channels=3, projector_input_dim=4096, projector_output_dim=4096, vision_output_dim=4096)


def _llama4_vision_and_projector_params(v: dict, text_hidden: int) -> int:
    """The vision tower and projector of Llama4ForConditionalGeneration, module by module as Transformers builds
    them (src/transformers/models/llama4/modeling_llama4.py): Llama4VisionModel's patch_embedding
    (Llama4UnfoldConvolution, a Linear of C·p² → h without bias), class_embedding (h), positional_embedding_vlm
    ((image/patch)² + 1 rows of h), layernorm_pre and layernorm_post (LayerNorm: 2·h each); per encoder layer
    (Llama4VisionEncoderLayer) q, k, v, o Linear h → h with bias, the MLP fc1 h → f and fc2 f → h with biases,
    input_layernorm and post_attention_layernorm (2·h each); vision_adapter (Llama4VisionPixelShuffleMLP →
    Llama4VisionMLP2) fc1 f → projector_input_dim and fc2 projector_output_dim → projector_output_dim without bias;
    and Llama4MultiModalProjector's linear_1 vision_output_dim → the text hidden size without bias."""
    h, f = v["hidden_size"], v["intermediate_size"]
    patches = (v["image_size"] // v["patch_size"]) ** 2 + 1
    stem = v["num_channels"] * v["patch_size"] ** 2 * h + h + patches * h + 2 * 2 * h
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    adapter = f * v["projector_input_dim"] + v["projector_output_dim"] ** 2
    projector = v["vision_output_dim"] * text_hidden
    return stem + v["num_hidden_layers"] * layer + adapter + projector


def test_llama_4_scout_with_its_vision_tower_is_its_card():
    """Meta's card (huggingface.co/meta-llama/Llama-4-Scout-17B-16E): 17B active, 109B total. The card's total
    counts the vision tower: the checkpoint (Llama4ForConditionalGeneration) holds the text model, the vision
    encoder and the projector, 108,641,793,536 parameters (its safetensors metadata,
    safetensors.parameters.BF16). The shipped config is the text model alone, as training text costs it: its
    count plus the tower counted above from vision_config is the checkpoint's to the parameter, and 0.33 %
    below the card's rounded 109 B. The active count (the text model's) rounds to 17 B."""
    with pytest.warns(UnmodelledFieldWarning, match="no_rope_layers"):
        model = hf("llama-4-scout")
    tower = _llama4_vision_and_projector_params(SCOUT_VISION, 5120)
    assert tower == 871_932_416
    assert model.total_params == 107_769_861_120
    assert model.total_params + tower == 108_641_793_536
    assert model.total_params + tower == pytest.approx(109e9, rel=0.005)
    assert round(model.active_params / 1e9) == 17


def test_gemma_3_counts_its_four_norms_per_layer():
    """Gemma 3's decoder layer (Transformers' Gemma3DecoderLayer) has four RMSNorms over h — input_layernorm,
    post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm — and q_norm, k_norm over the
    head: with them the text model of gemma-3-27b is 27,009,346,304 parameters, llama.cpp's n_params for its
    text GGUF (vocab 262,208, n_embd 5376); the report's 1,416 M + 25,600 M = 27,016 M is 0.03 % above."""
    model = hf("gemma-3-27b")
    h, layers, d = 5376, 62, 128
    attention = 2 * h * 32 * d + 2 * h * 16 * d
    block = attention + 3 * h * 21504 + 4 * h + 2 * d
    assert model.block_params == block
    assert model.total_params == 262_208 * h + layers * block + h == 27_009_346_304


def test_a_pattern_layer_counts_its_own_parameters():
    """Nemotron-H 8B, arithmetic here: a Mamba layer's in_proj h·(2D + 2GN + H), out_proj D·h, conv
    (D + 2GN)·(K + 1), A_log, D and dt_bias per head, the gated norm's D and the pre-norm's h."""
    model = hf("nemotron-h-8b")
    h, d, gn, heads = 4096, 128 * 64, 8 * 128, 128
    mamba = h * (2 * d + 2 * gn + heads) + d * h + (d + 2 * gn) * 5 + 3 * heads + d + h
    assert model.pattern_layer_params("M") == mamba
    assert model.pattern_layer_params("-") == 2 * h * 21504 + h
    assert model.pattern_layer_params("*") == 2 * h * 4096 + 2 * h * 1024 + h


def _paper_ssd_flops(h, heads, p, groups, n, k, q):
    """Forward FLOPs per token of a Mamba-2 layer written from Dao & Gu 2024 §6 (arXiv:2405.21060):
    projections, the depthwise conv, and the chunked scan's four steps with chunk q."""
    d = heads * p
    projections = 2 * h * (2 * d + 2 * groups * n + heads) + 2 * d * h
    conv = 2 * k * (d + 2 * groups * n)
    diagonal = 2 * q * n * groups + 2 * q * p * heads          # C·Bᵀ per group, (L∘CBᵀ)·X per head
    states = 2 * n * p * heads                                  # Bᵀ·X per chunk, over q tokens
    passing = 2 * n * p * heads / q                             # one state update per chunk
    output = 2 * n * p * heads                                  # C·state
    return projections + conv + diagonal + states + passing + output


@pytest.mark.parametrize("shape", [dict(h=4096, heads=128, p=64, groups=8, n=128, k=4, q=128),
                                   dict(h=2688, heads=64, p=64, groups=8, n=128, k=4, q=256)])
def test_mamba_forward_and_backward_flops_match_the_paper(shape):
    mamba = MambaShape(heads=shape["heads"], head_dim=shape["p"], state_size=shape["n"], groups=shape["groups"],
                       conv_kernel=shape["k"], chunk_size=shape["q"])
    forward = sum(mamba_forward_flops_per_token(mamba, shape["h"], seq=8192).values())
    expected = _paper_ssd_flops(**shape)
    assert forward == pytest.approx(expected, rel=1e-12)
    # backward: twice forward (activation gradient and weight gradient), so a training step 3×
    assert 3 * forward == pytest.approx(3 * expected, rel=1e-12)


def test_mamba_backward_reruns_the_conv_and_part_of_the_scan():
    """mamba_ssm v2.2.6.post3 (state-spaces/mamba 10b5d6358f27966f6a40e4bf0baa17a460688128),
    ops/triton/ssd_combined.py: MambaSplitConv1dScanCombinedFn.backward reruns causal_conv1d_fwd ("Recompute x, B,
    C") and _mamba_chunk_scan_combined_bwd reruns _bmm_chunk_fwd (C·Bᵀ, 2·Q·N per group and token),
    _chunk_state_fwd (Bᵀ·X, 2·N·P per head and token) and _state_passing_fwd (2·N·P per head and chunk) whatever
    the recompute setting. Nemotron-H 8B, 8,192 tokens, tp 2: those FLOPs, and time for them beside a backward
    that stays twice the forward."""
    seq, tp = 8192, 2
    c = Context.build(hf("nemotron-h-8b", seq), H100, Datatype.bfloat16)
    m = _scalar_fields(Mapping(num_procs=tp, tensor_par=tp, pipeline_par=1, data_par=1, batch_size=1,
                               microbatch_size=1, tensor_par_comm_type="rs_ag", seq_par_ag_redo=True))
    layer = mamba_layer(c, m, ScalarOps)
    groups, q, n, heads, p = 8, 128, 128, 128, 64
    per_token = 2 * groups * q * n + heads * 2 * n * p + heads * 2 * n * p / q
    assert layer.kernel_recompute_flops == pytest.approx(seq * per_token / tp, rel=1e-12)
    assert layer.kernel_recompute_s > 0 and layer.backward_s == pytest.approx(2 * layer.forward_s, rel=1e-12)


def test_mamba_stored_activations_split_tp_ways():
    mamba = MambaShape(heads=128, head_dim=64, state_size=128, groups=8)
    whole = mamba_stored_bytes_per_token(mamba, 4096, 2.0, tp=1)
    split = mamba_stored_bytes_per_token(mamba, 4096, 2.0, tp=8)
    assert whole["in_proj_out"] == 2.0 * (2 * 8192 + 2 * 8 * 128 + 128)
    assert split["in_proj_out"] == whole["in_proj_out"] / 8 and split["input"] == whole["input"]


def _saved_by_a_megatron_mamba_layer(config: dict, tokens: int, tp: int, seq_par: bool, ag_redo: bool,
                                     e: float = 2.0) -> dict:
    """Bytes one Mamba layer saves for backward (BF16, one microbatch of `tokens` tokens, one GPU), tensor by
    tensor, read from the code that runs it, written from the Hugging Face config's fields:

    - Megatron-Core core_v0.16.0 (NVIDIA/Megatron-LM 3bec9aa97dda898d16ff5a89bac0ed2b6682b172):
      models/mamba/mamba_layer_specs.py builds in_proj as TELayerNormColumnParallelLinear (the pre-norm fused
      in) and out_proj as TERowParallelLinear; ssm/mamba_mixer.py `_ssm_training` (use_mamba_mem_eff_path,
      the default) calls mamba_split_conv1d_scan_combined on `rearrange(zxBCdt).contiguous()` without
      rmsnorm_weight or outproj_weight, then `self.norm(y)` (ExtendedRMSNorm, mamba_ssm's gated RMSNorm, one
      group size D/G); ssm/mamba_layer.py adds the residual by bias_dropout_add (hidden_dropout).
    - mamba_ssm v2.2.6.post3 (state-spaces/mamba 10b5d6358f27966f6a40e4bf0baa17a460688128):
      ops/triton/ssd_combined.py MambaSplitConv1dScanCombinedFn.forward `ctx.save_for_backward(zxbcdt,
      conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd,
      outproj_weight, outproj_bias)`: of activations zxbcdt and out_x (the scan's output before the z gate,
      _chunk_scan_fwd allocates it in x's dtype); rstd is None without rmsnorm_weight; the rest are
      parameters or None. ops/triton/layernorm_gated.py LayerNormFn.forward `ctx.save_for_backward(x, weight,
      bias, mean, rstd, z)`: x and rstd (fp32, one per group per row; mean None for RMS, z None here).
    - Transformer Engine v2.8 (NVIDIA/TransformerEngine 40c69e751a47ec87786283e125c5eb264101270f),
      pytorch/module/layernorm_linear.py `prepare_for_saving(inputmat, weightmat, weight, bias, ln_weight, ln_out,
      mu, rsigma)`: the input, the norm's output (in_proj's input; under sequence parallelism TE frees the gathered
      copy and keeps its shard, re-gathering in backward — the mapping's seq_par_ag_redo; not redone, the gathered
      tensor) and rsigma (fp32 per row); pytorch/module/linear.py keeps its input.
    """
    h, heads, p = config["hidden_size"], config["mamba_num_heads"], config["mamba_head_dim"]
    groups, n = config["n_groups"], config["ssm_state_size"]
    d = heads * p
    shard = tokens / tp if seq_par else tokens          # the residual stream's rows on this GPU
    in_proj_rows = shard if seq_par and ag_redo else tokens
    dropout = config["hidden_dropout"] > 0
    return {
        "pre-norm input": e * shard * h,
        "in_proj input": e * in_proj_rows * h,
        "zxbcdt": e * tokens * (2 * d + 2 * groups * n + heads) / tp,
        "out_x": e * tokens * d / tp,
        "gated norm input": e * tokens * d / tp,
        "out_proj input": e * tokens * d / tp,
        "dropout mask": 1.0 * shard * h if dropout else 0.0,
        "pre-norm rsigma": 4.0 * shard,
        "gated norm rstd": 4.0 * tokens * groups / tp,
    }


_STATISTICS = ("pre-norm rsigma", "gated norm rstd")
"""fp32 norm statistics, which the model leaves out as it does for a transformer block (Korthikanti et al.
2022 count none): under 0.05 % of these layers' bytes, hence the stated tolerance of 0.1 %."""


@pytest.mark.parametrize("name", ["nemotron-h-8b", "nemotron-3-nano-30b-a3b"])
@pytest.mark.parametrize("tp,comm,ag_redo", [(1, "ar", False), (2, "rs_ag", True), (4, "rs_ag", False),
                                             (8, "ar", False)])
def test_mamba_stored_activations_are_what_megatron_core_saves(name, tp, comm, ag_redo):
    """A Mamba layer's stored activations (block_memory.stored_activations, kind "mamba") against the tensors
    Megatron-Core and mamba_ssm save for backward, counted above from the config's fields: equal to the
    count without the fp32 norm statistics (1e-12), within 0.1 % of the count with them."""
    seq = 8192
    config = json.loads((MODELS / name / "config.json").read_text())
    c = Context.build(hf(name, seq), H100, Datatype.bfloat16)
    fields = dict(seq_par_ag_redo=ag_redo) if comm == "rs_ag" else {}
    m = _scalar_fields(Mapping(num_procs=tp, tensor_par=tp, pipeline_par=1, data_par=1, batch_size=1,
                               microbatch_size=1, tensor_par_comm_type=comm, **fields))
    stored = stored_activations(c, m, ScalarOps, "mamba")
    saved = _saved_by_a_megatron_mamba_layer(config, seq, tp, comm == "rs_ag", ag_redo)
    without_statistics = sum(v for k, v in saved.items() if k not in _STATISTICS)
    assert stored.stored == stored.full == pytest.approx(without_statistics, rel=1e-12)
    assert stored.full == pytest.approx(sum(saved.values()), rel=1e-3)


def test_mamba_stored_activations_under_full_recompute_and_dropout():
    """Full recomputation keeps the layer's input only; a model trained with dropout keeps the residual add's
    mask, one byte per element of the residual stream (as a transformer block's masks)."""
    seq = 4096
    c = Context.build(hf("nemotron-h-8b", seq), H100, Datatype.bfloat16)
    m = _scalar_fields(Mapping(num_procs=1, tensor_par=1, pipeline_par=1, data_par=1, batch_size=1,
                               microbatch_size=1, activation_recompute="full"))
    stored = stored_activations(c, m, ScalarOps, "mamba")
    assert stored.stored == 2.0 * seq * 4096 and stored.workspace == stored.full
    with_dropout = stored_activations(replace(c, model=replace(c.model, dropout=True)), m, ScalarOps, "mamba")
    assert with_dropout.full - stored.full == seq * 4096


def test_mamba_stored_gemm_inputs_under_fp8_are_quantized_copies():
    """Under an FP8 recipe Transformer Engine keeps a GEMM's input as its quantized copy (v2.8
    pytorch/module/linear.py and layernorm_linear.py); Megatron-Core's MambaMixer does not ask out_proj to keep its
    BF16 input (core_v0.16.0 calls set_save_original_input for attention's linear_proj, the MoE experts' fc2, never
    for the Mamba layer). So in_proj's input (h) and out_proj's (D) drop from 2 bytes to the copy's; the rest of
    the layer is BF16 as before."""
    seq = 4096
    model = hf("nemotron-h-8b", seq)
    m = _scalar_fields(Mapping(num_procs=1, tensor_par=1, pipeline_par=1, data_par=1, batch_size=1,
                               microbatch_size=1))
    bf16 = stored_activations(Context.build(model, H100, Datatype.bfloat16), m, ScalarOps, "mamba")
    fp8 = Context.build(model, H100, Datatype.bfloat16, Kernels(precision=Precision.fp8_tensorwise))
    copy = fp8.precision.recipe.copy_bytes
    assert 1.0 <= copy < 2.0
    assert bf16.full - stored_activations(fp8, m, ScalarOps, "mamba").full == pytest.approx(
        (2.0 - copy) * seq * (4096 + 8192), rel=1e-12)


@pytest.mark.parametrize("tp,cp,allowed", [(1, 1, True), (8, 1, True), (16, 1, False), (2, 4, True),
                                           (8, 2, True), (4, 64, False), (3, 1, False)])
def test_mamba_degrees_megatron_allows(tp, cp, allowed):
    """Nemotron-H 8B: 128 heads, 8 groups. tp divides heads and groups; tp·cp divides heads; the groups on a
    TP rank divide by cp or divide cp (mamba_context_parallel.py)."""
    assert mamba_allows(MambaShape(heads=128, head_dim=64, state_size=128, groups=8), tp, cp) is allowed


def test_bridge_counts_mamba_on_twice_the_hidden_width():
    """Megatron-Bridge's mamba_layer_flops takes d_in = 2·h whatever H·P is: for Nemotron 3 Nano (H·P 4096,
    2·h 5376) its count is above the layer's own."""
    nano = hf("nemotron-3-nano-30b-a3b").mamba
    own = 3 * sum(mamba_forward_flops_per_token(nano, 2688, 8192).values())
    assert bridge_mamba_flops_per_token(nano, 2688) > own


def test_gemma_3_sliding_layers_cost_window_over_sequence():
    """Gemma 3 27B at 32K tokens: 52 of its 62 layers attend over 1,024 tokens; a sliding layer's core does
    (2·s·w − w²)/s² of a global layer's work, about 2·w/s."""
    model = hf("gemma-3-27b", seq=32768)
    assert model.window_blocks == 52 and model.sliding_window == 1024
    ratio = window_core_ratio(1024, 32768)
    assert ratio == pytest.approx((2 * 32768 * 1024 - 1024 ** 2) / 32768 ** 2)
    assert ratio < 1 and ratio == pytest.approx(2 * 1024 / 32768, rel=0.02)
    # in the cost model: against the same model without the window, a block (the average of its 62) does
    # 52/62 · (1 − ratio) less of the causal core's 2·a·d·s² FLOPs (QKᵀ and ·V halved), and its core's time is
    # (10 + 52·ratio)/62 of the global one
    m = _scalar_fields(Mapping(num_procs=1, tensor_par=1, pipeline_par=1, data_par=1, batch_size=1,
                               microbatch_size=1))
    windowed = block_forward_times(Context.build(model, H100, Datatype.bfloat16), m, ScalarOps)
    full = model.model_copy(update={"sliding_window": 0, "sliding_window_blocks": None})
    everywhere = block_forward_times(Context.build(full, H100, Datatype.bfloat16), m, ScalarOps)
    core = 2 * 32 * 128 * 32768 ** 2
    assert everywhere.matrix_flops - windowed.matrix_flops == pytest.approx(core * 52 / 62 * (1 - ratio), rel=1e-12)
    assert windowed.attention_core_s == pytest.approx(everywhere.attention_core_s * (10 + 52 * ratio) / 62, rel=1e-12)


def test_a_pattern_in_a_yaml_model_reads_as_in_a_config():
    nano = hf("nemotron-3-nano-30b-a3b")
    again = Model(**json.loads(nano.model_dump_json()))
    assert again.total_params == nano.total_params and again.layer_pattern == nano.layer_pattern


@pytest.mark.parametrize("change,words", [
    (dict(layer_pattern="MX"), "unknown symbols"),
    (dict(layer_pattern="M*M"), "num_blocks"),
    (dict(mamba=None), "needs mamba"),
])
def test_bad_patterns_are_refused(change, words):
    fields = json.loads(hf("nemotron-h-8b").model_dump_json())
    fields.update(change)
    with pytest.raises(ValidationError, match=words):
        Model(**fields)


def test_unmodelled_hybrid_fields_are_refused_by_name():
    with pytest.raises(InputError, match="num_nextn_predict_layers"):
        hf("nemotron-3-super")
    with pytest.raises(InputError, match="attention_chunk_size"):
        hf("llama-4-scout", seq=16384)


def test_models_without_a_pattern_count_as_before():
    model = hf("qwen3-30b-a3b", seq=4096)
    assert model.layer_pattern is None and model.total_params == pytest.approx(30.532e9, rel=1e-4)
