"""Today's open models read from their Hugging Face config.json: DeepSeek-V3 (multi-head latent
attention, three dense blocks then MoE, multi-token prediction), gpt-oss 120B and 20B
(alternating sliding-window and full attention, sinks, biases) and Qwen3 dense (explicit head
size, query/key norms) — their parameter counts against the model cards, one block's FLOP and
weights against arithmetic done here, the sliding window's time, the readers' errors, and
`mapsat eval` on a DeepSeek-V3 mapping from Megatron-Bridge's published rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import plain, solve_equals_brute_force

from costmodel.terms.block import block_forward_times
from costmodel.terms.block_memory import block_stored_activation_bytes
from costmodel.terms.context import MASK_BYTES, Context
from costmodel.errors import InputError
from costmodel.evaluate import _scalar_fields, evaluate
from costmodel.terms.layer_time import SOFTMAX_STATS_BYTES
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.ops import ScalarOps
from costmodel.terms.param_counts import ParameterCounts
from costmodel.space.layout import stage_blocks
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_mapping import map_run, mtp_layout
from costmodel.inputs.system import Datatype
from solver.cli.app import cli

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "problems" / "models"
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")


def hf(name: str, seq: int = 4096):
    return load_model(MODELS / name / "config.json", seq_size=seq)


# ---- parameter counts, as the model cards count them ----

def test_deepseek_v3_counts_match_its_card():
    # DeepSeek-V3 technical report (arXiv:2412.19437, abstract): "671B total parameters with
    # 37B activated for each token"; its Hugging Face README: "685B, which includes 671B of
    # the Main Model weights and 14B of the Multi-Token Prediction (MTP) Module weights".
    m = hf("deepseek-v3")
    assert m.total_params == pytest.approx(671e9, rel=0.005)
    assert m.active_params == pytest.approx(37e9, rel=0.02)
    # The checkpoint's 685B is the main model and the MTP module with its own embedding and
    # output copies; 14B is 685 − 671 of two rounded figures (13.5 to 14.5 B): within 5 %.
    assert m.total_params + m.mtp_checkpoint_params == pytest.approx(685e9, rel=0.005)
    assert m.mtp_checkpoint_params == pytest.approx(14e9, rel=0.05)
    assert m.mtp_params < m.mtp_checkpoint_params         # shared embedding and output (report §2.2)


@pytest.mark.parametrize("name, total, active", [
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), Table 1: total 116.83B and 20.91B,
    # active 5.13B and 3.61B, which count the unembedding and not the embedding (its
    # "Embed+Unembed" 1.16B row is both matrices of 0.58B).
    ("gpt-oss-120b", 116.83e9, 5.13e9),
    ("gpt-oss-20b", 20.91e9, 3.61e9),
])
def test_gpt_oss_counts_match_its_card(name, total, active):
    m = hf(name)
    assert m.total_params == pytest.approx(total, rel=0.005)
    assert m.active_params_without_embedding == pytest.approx(active, rel=0.01)


@pytest.mark.parametrize("name, total, non_embedding", [
    # Qwen3-8B and Qwen3-32B model cards: "Number of Parameters: 8.2B / Non-Embedding: 6.95B",
    # "32.8B / 31.2B".
    ("qwen3-8b", 8.2e9, 6.95e9),
    ("qwen3-32b", 32.8e9, 31.2e9),
])
def test_qwen3_dense_counts_match_its_card(name, total, non_embedding):
    m = hf(name)
    assert m.attn_size == 128                   # head_dim read, not hidden / heads (5120 / 64 = 80 for 32B)
    assert m.qk_norm
    assert m.total_params == pytest.approx(total, rel=0.005)
    assert m.total_params - m.embedding_params - m.output_params == pytest.approx(non_embedding, rel=0.005)


@pytest.mark.parametrize("name, total", [
    # Hugging Face hub counts of the safetensors weights (problems/models/README.md).
    ("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.6e9), ("llama-3.1-405b", 405.9e9),
])
def test_dense_counts_unchanged_and_all_active(name, total):
    counts = ParameterCounts.of(hf(name))
    assert counts.total == pytest.approx(total, rel=0.005)
    assert counts.active == counts.total and counts.mtp == 0


# ---- one block's weights and FLOP by hand ----

MLA_WEIGHTS = (7168 * 1536            # q_a_proj
               + 1536 * 128 * 192     # q_b_proj: 128 heads of d_qk = 128 + 64
               + 7168 * (512 + 64)    # kv_a_proj_with_mqa: compressed K/V and the shared RoPE key
               + 512 * 128 * (128 + 128)   # kv_b_proj: per-head K (no RoPE part) and V
               + 128 * 128 * 7168)    # o_proj from 128 heads of d_v = 128


def test_latent_attention_weights_by_hand():
    m = hf("deepseek-v3")
    assert MLA_WEIGHTS == 187_105_280
    assert m.attention_weight_params == MLA_WEIGHTS
    # two block norms over h, the q_a and kv_a norms; no biases
    assert m.attention_vector_params == 2 * 7168 + 1536 + 512
    assert m.block_params == MLA_WEIGHTS + 2 * 7168 + 1536 + 512 + 3 * 7168 * 18432   # a dense block
    assert (m.dense_blocks, m.moe_blocks) == (3, 58)
    assert m.moe_block_params == (MLA_WEIGHTS + 2 * 7168 + 1536 + 512 + 7168 * 256
                                  + (256 + 1) * 3 * 7168 * 2048)


def _block(model, tp: int = 1, seq_par: bool = False, **kernels):
    c = Context.build(model, H100, Datatype.bfloat16)
    mapping = Mapping(num_procs=tp, tensor_par=tp, pipeline_par=1, data_par=1, batch_size=1, microbatch_size=1,
                      tensor_par_comm_type="rs_ag" if seq_par else "ar")
    return c, _scalar_fields(mapping)


def test_latent_attention_block_flops_by_hand():
    s = 4096
    model = hf("deepseek-v3", s)
    c, m = _block(model)
    flops = block_forward_times(c, m, ScalarOps).matrix_flops            # a dense block (the first three)
    core = (2 * 128 * s * s * 192 + 2 * 128 * s * s * 128) / 2           # Q·Kᵀ over d_qk, ·V over d_v (causal half)
    assert flops == pytest.approx(2 * s * MLA_WEIGHTS + 2 * s * 3 * 7168 * 18432 + core, rel=1e-12)
    # tp 2 with sequence parallelism: the down projections on each GPU's s/2 tokens, whole;
    # the up projections, the output projection, the core and the MLP split two ways.
    c, m = _block(model, tp=2, seq_par=True)
    down = 7168 * 1536 + 7168 * 576
    split = MLA_WEIGHTS - down
    expected = 2 * (s / 2) * down + 2 * s * split / 2 + 2 * s * 3 * 7168 * 18432 / 2 + core / 2
    assert block_forward_times(c, m, ScalarOps).matrix_flops == pytest.approx(expected, rel=1e-12)


def test_latent_attention_stored_activations_by_hand():
    s, e = 4096, 2
    model = hf("deepseek-v3", s)
    c, m = _block(model)
    stored = block_stored_activation_bytes(c, m, ScalarOps).full
    h, f = 7168, 18432
    # DeepSeek-V3 trains without dropout (attention_dropout 0): no masks
    masks = 2 * MASK_BYTES * s * h if model.dropout else 0.0
    norms_masks_inputs = 2 * e * s * h + masks + 2 * e * s * h
    attention = e * s * (128 * 192 + 128 * 192 + 128 * 128 + 128 * 128) + 2 * e * s * (1536 + 512)
    mlp = 3 * e * s * f + (0 if c.settings.fused_activation else e * s * f)
    core = SOFTMAX_STATS_BYTES * 128 * s                                   # the fused kernel's statistics
    assert stored == pytest.approx(norms_masks_inputs + attention + mlp + core, rel=1e-12)


# ---- the sliding window ----

def test_sliding_window_attention_costs_less_than_full():
    s, w = 4096, 128
    windowed = hf("gpt-oss-120b", s)
    assert (windowed.sliding_window, windowed.window_blocks) == (w, 18)
    full = windowed.model_copy(update={"sliding_window": 0, "sliding_window_blocks": None})
    core = {name: block_forward_times(*_block(model), ScalarOps).attention_core_s
            for name, model in (("windowed", windowed), ("full", full))}
    assert core["windowed"] < core["full"]
    # half the blocks see (2·s·w − w²)/s² of a causal core's work, the other half all of it
    ratio = 0.5 + 0.5 * (2 * s * w - w * w) / (s * s)
    assert core["windowed"] / core["full"] == pytest.approx(ratio, rel=1e-9)


def test_gpt_oss_biases_and_sinks_are_counted():
    m = hf("gpt-oss-120b")
    assert m.bias and m.attention_sinks and m.router_bias
    # Q, K, V and output biases (64·64 + 2·8·64 + 2880), 64 sinks, two RMSNorms
    assert m.attention_vector_params == 4096 + 1024 + 2880 + 64 + 2 * 2880
    assert m.expert_params == 3 * 2880 * 2880 + 2 * 2880 + 2880
    assert m.router_params == 2880 * 128 + 128


# ---- the readers refuse a wrong-typed field in one line ----

@pytest.mark.parametrize("name, field, value", [
    ("deepseek-v3", "kv_lora_rank", "512"),
    ("deepseek-v3", "num_nextn_predict_layers", True),
    ("gpt-oss-120b", "layer_types", "sliding_attention"),
    ("gpt-oss-20b", "sliding_window", 12.5),
    ("qwen3-8b", "head_dim", "128"),
])
def test_wrong_typed_field_is_a_one_line_error(tmp_path, name, field, value):
    data = json.loads((MODELS / name / "config.json").read_text())
    data[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_model(path, seq_size=4096)
    message = str(err.value)
    assert field in message and "\n" not in message


def test_layer_types_of_the_wrong_length_is_named(tmp_path):
    data = json.loads((MODELS / "gpt-oss-20b" / "config.json").read_text())
    data["layer_types"] = data["layer_types"][:-1]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="layer_types.*24 layers.*23 entries"):
        load_model(path, seq_size=4096)


# ---- multi-token prediction and a published DeepSeek-V3 run ----

MTP_ROW = "bridge2511_deepseek_v3_b200_mxfp8_256_mtp"      # the 25.11 table's "DeepSeekV3 (w/ MTP)" row


def _bridge_mapping():
    runs = {run.name: run for run in read_runs(ROOT / "problems/runs/megatron-bridge-pretraining.json")}
    run = runs[MTP_ROW]
    model = hf("deepseek-v3", run.seq_size)
    system = load_system(ROOT / "problems/systems" / f"{run.system}.yaml")
    return run, model, system, map_run(run, model, system)


def test_bridge_deepseek_row_maps_with_the_mtp_layout():
    run, model, system, mapped = _bridge_mapping()
    # The row states its layout (Megatron-Bridge's set_deepseek_v3_pipeline_model_parallel_layout
    # for pp 16: the embedding and 4 blocks, 14 stages of 4, one block, the MTP module and the loss).
    assert run.pipeline_layout == "Et*4|(t*4|)*14tmL"
    # That is the layout rule's short last chunk (costmodel.terms.pipeline: 4, 4 × 14, 1), so
    # the mapping states no layout of its own and needs no MTP rule; stated, it costs the same
    # to the last bit.
    assert (run.pp, mapped.mapping.pipeline_first_stage_blocks, mapped.mapping.pipeline_last_stage_blocks) == \
        (16, None, None)
    assert not any("layout" in gap for gap in mapped.not_expressible)
    assert mtp_layout(model, 16, 1) is None
    assert stage_blocks(ScalarOps, 61.0, 16.0) == (4.0, 4.0, 1.0)
    stated = mapped.mapping.model_copy(update={"pipeline_first_stage_blocks": 4, "pipeline_last_stage_blocks": 1})
    with_fields, by_rule = evaluate(model, system, stated), evaluate(model, system, mapped.mapping)
    assert (with_fields.iteration_time_s, with_fields.memory) == (by_rule.iteration_time_s, by_rule.memory)


def test_mtp_module_costs_time_and_last_stage_memory():
    _, model, system, mapped = _bridge_mapping()
    with_mtp = evaluate(model, system, mapped.mapping)
    without = evaluate(model.model_copy(update={"mtp_blocks": 0}), system, mapped.mapping)
    assert with_mtp.iteration_time_s > without.iteration_time_s
    assert with_mtp.memory.last_stage_hbm_bytes > without.memory.last_stage_hbm_bytes
    # the first stage holds no MTP module
    assert with_mtp.memory.first_stage_hbm_bytes == without.memory.first_stage_hbm_bytes


def test_mapsat_eval_runs_on_a_deepseek_v3_bridge_mapping(tmp_path):
    run, model, _, mapped = _bridge_mapping()
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps(mapped.mapping.model_dump(mode="json")))
    args = ["eval", "--model", str(MODELS / "deepseek-v3" / "config.json"), "--seq-size", str(run.seq_size),
            "--system", str(ROOT / "problems/systems" / f"{run.system}.yaml"), "--mapping", str(mapping)]
    result = CliRunner().invoke(cli, [*args, "--json"])
    # the row's memory settings are not recorded: over HBM, eval prints the breakdown and exits 1
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:
        assert "does not fit" in result.stderr and "Traceback" not in result.stderr
    out = json.loads(result.stdout)
    assert math.isfinite(out["iteration_time_s"]) and out["iteration_time_s"] > 0
    assert out["parameters"]["total"] == model.total_params and out["parameters"]["mtp"] == model.mtp_params
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == result.exit_code and "671.03 B parameters, 37.55 B active" in table.output


# ---- the search stays exact on these models: solve == brute force, certified ----

TINY_DEEPSEEK = dict(hidden=512, feedforward=1024, seq_size=1024, attn_heads=8, attn_size=48, num_blocks=4,
                     vocab_size=32000, mlp="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False,
                     bias=False, num_experts=8, experts_per_token=2, expert_feedforward=256, shared_experts=1,
                     shared_expert_feedforward=256, first_dense_blocks=1, mtp_blocks=1,
                     latent_attention=dict(q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
                                           qk_rope_head_dim=16, v_head_dim=32))
TINY_GPT_OSS = dict(hidden=512, feedforward=512, seq_size=2048, attn_heads=8, attn_size=64, kv_heads=2, num_blocks=4,
                    vocab_size=32000, mlp="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False,
                    bias=True, num_experts=8, experts_per_token=2, expert_feedforward=512, router_bias=True,
                    attention_sinks=True, sliding_window=128, sliding_window_blocks=2)


@pytest.mark.parametrize("fields", [TINY_DEEPSEEK, TINY_GPT_OSS], ids=["mla-mtp-first-dense", "window-sinks-biases"])
def test_solve_equals_brute_force_on_the_new_architectures(fields):
    from costmodel.inputs.kernels import Kernels
    from costmodel.inputs.model import Model
    from solver.space.declaration import get_space

    model, system, gpus, max_batch = Model(**fields), H100.with_overrides(hbm_gib=8), 8, 16
    space = plain(get_space("full"))         # as before cp_comm and hybrid sharding
    _, reference = solve_equals_brute_force(model, system, gpus, max_batch, space, Datatype.bfloat16, Kernels(),
                                            top_k=2, time_limit_s=300)
    # the scalar path (evaluate) agrees with the array path brute force scored
    scalar = evaluate(model, system, reference.best.mapping)
    assert math.isclose(scalar.iteration_time_s, reference.best.iteration_time_s, rel_tol=1e-9)


def test_bridge_flops_with_latent_attention_reproduce_deepseek_v3s_published_tflops():
    """Every DeepSeek-V3 row with both figures: tokens/s per GPU × Bridge's FLOP per token
    (latent-attention branch, one MTP module unless the row says "w/o MTP") against the row's
    TFLOP/s per GPU, both as published (4 significant digits). Measured: within 0.25 %."""
    from costmodel.terms.published_flops import bridge_flops_per_token

    path = ROOT / "problems/runs/megatron-bridge-pretraining.json"
    rows = {row["id"]: row for row in json.loads(path.read_text())}
    errors = []
    for run in read_runs(path):
        row = rows[run.name]
        if run.model != "deepseek-v3" or not (row.get("tflops_per_gpu") and row.get("tokens_per_s_per_gpu")):
            continue
        model = hf("deepseek-v3", run.seq_size)
        system = load_system(ROOT / "problems/systems" / f"{run.system}.yaml")
        mapped = map_run(run, model, system)
        c = Context.build(model, system, mapped.datatype, mapped.mapping.kernels)
        mtp = 0 if run.name.endswith("_nomtp") else 1
        ours = bridge_flops_per_token(c, run.tp, mtp) * row["tokens_per_s_per_gpu"] / 1e12
        errors.append(abs(ours / row["tflops_per_gpu"] - 1))
    assert len(errors) >= 15
    assert max(errors) < 0.005


def test_mapsat_solve_states_the_parameter_counts():
    args = ["solve", "--model", str(MODELS / "gpt-oss-20b" / "config.json"), "--seq-size", "4096",
            "--system", str(ROOT / "problems/systems/h100-80g-nvl8.yaml"), "--gpus", "8", "--max-batch", "16",
            "--fix", "cp_comm=p2p", "--fix", "shard=all"]          # as before cp_comm and hybrid sharding
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.output)["parameters"]
    assert counts == ParameterCounts.of(hf("gpt-oss-20b")).to_dict()
    assert counts["active_without_embedding"] == pytest.approx(3.61e9, rel=0.01)
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0 and "20.91 B parameters, 4.19 B active (3.61 B without the input embedding)" in table.output
