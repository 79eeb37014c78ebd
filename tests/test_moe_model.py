"""Mixture-of-experts models: the fields, their one-line errors, the Hugging Face readers, and
total and active parameter counts against the published figures (sources below and in
problems/models/README.md)."""

import json
import warnings
from pathlib import Path

import pytest

from costmodel.errors import InputError
from costmodel.inputs.hf import UnmodelledFieldWarning
from costmodel.inputs.load import load_model
from costmodel.inputs.model import Model

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "problems" / "models"


def hf(name: str, seq_size: int = 4096) -> Model:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmodelledFieldWarning)      # the shipped files read cleanly
        return load_model(MODELS / name / "config.json", seq_size=seq_size)


# (total, active) parameters as published:
#   Mixtral 8x7B: Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters but only
#     uses 12.9B parameters per token".
#   Mixtral 8x22B: Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): "39B active
#     parameters out of 141B".
#   Qwen1.5-MoE-A2.7B: its model card, "14.3B parameters in total and 2.7B activated parameters".
#   Qwen3-30B-A3B: its model card, "30.5B in total and 3.3B activated" (active checked below).
PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9),
             "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9), "qwen3-30b-a3b": (30.5e9, None)}


@pytest.mark.parametrize("name", PUBLISHED)
def test_total_and_active_parameters_match_the_published_figures(name):
    total, active = PUBLISHED[name]
    m = hf(name)
    assert m.total_params == pytest.approx(total, rel=0.005)
    if active is not None:
        assert m.active_params == pytest.approx(active, rel=0.005)


def test_qwen3_30b_a3b_non_embedding_and_active_counts():
    # The card: "Number of Parameters (Non-Embedding): 29.9B"; "3.3B activated", two digits only:
    # 3.353 B sits where rounding to two digits is ambiguous, so 2 % (the non-embedding figure,
    # which shares every block term, agrees to 0.03 %).
    m = hf("qwen3-30b-a3b")
    assert m.total_params - m.embedding_params - m.output_params == pytest.approx(29.9e9, rel=0.005)
    assert m.active_params == pytest.approx(3.3e9, rel=0.02)


def test_mixtral_8x7b_counted_by_hand():
    # h 4096, 32 blocks, 32 query heads and 8 key/value heads of 128, 8 experts of 3·h·14336 (SwiGLU),
    # router h × 8, two RMSNorms, untied embedding and output layer of 32000 × h, final norm.
    m = hf("mixtral-8x7b")
    h, f, E, L, V = 4096, 14336, 8, 32, 32000
    attention = 2 * h * h + 2 * h * 1024
    expert = 3 * h * f
    block = attention + E * expert + h * E + 2 * h
    assert (m.num_experts, m.experts_per_token, m.expert_feedforward, m.moe_blocks) == (8, 2, f, L)
    assert m.router_params == h * E and m.expert_params == expert and m.routed_expert_params == E * expert
    assert m.moe_block_params == block
    assert m.total_params == L * block + 2 * V * h + h
    assert m.active_params == L * (block - (E - 2) * expert) + 2 * V * h + h


def test_qwen1_5_moe_block_counted_by_hand():
    # 60 experts of 3·h·1408, one shared expert of 3·h·5632 with an h × 1 sigmoid gate, router
    # h × 60, Q, K, V with biases (Qwen2), output projection without, two RMSNorms.
    m = hf("qwen1.5-moe-a2.7b")
    h = 2048
    attention = 4 * h * h + 3 * h
    block = attention + 60 * 3 * h * 1408 + 3 * h * 5632 + h * 61 + 2 * h
    assert (m.shared_experts, m.shared_expert_feedforward, m.shared_expert_gate) == (1, 5632, True)
    assert m.shared_expert_params == 3 * h * 5632 and m.router_params == 61 * h
    assert m.moe_block_params == block
    assert m.moe_block_active_params == block - 56 * 3 * h * 1408


def test_model_flops_count_active_matrices_only():
    # 6 × (attention + router + k experts per MoE block, + the output layer) per token, plus attention
    # scores halved for the causal mask: the MFU numerator of a mixture-of-experts model (docs/cost-model.md).
    m = hf("mixtral-8x7b", 4096)
    h, f, L, V, s = 4096, 14336, 32, 32000, 4096
    matrices = L * (2 * h * h + 2 * h * 1024 + h * 8 + 2 * 3 * h * f) + h * V
    assert m.model_flops().matrix_params == matrices
    assert m.model_flops_per_sample() == pytest.approx((6 * matrices + 3 * 4 * s * h * L / 2) * s, rel=1e-12)


def test_dense_models_are_unchanged_by_the_expert_fields():
    dense = load_model(MODELS / "llama-3.1-70b" / "config.json", seq_size=8192)
    assert (dense.num_experts, dense.moe_blocks, dense.dense_blocks) == (0, 0, 80)
    assert dense.active_params == dense.total_params
    assert dense.total_params == 80 * dense.block_params + dense.embedding_params + dense.output_params


def test_every_other_block_has_experts():
    # decoder_sparse_step 2 over 5 layers: layers 2 and 4 (from 1) are sparse, 1, 3, 5 dense.
    m = Model(hidden=64, feedforward=256, seq_size=32, attn_heads=4, attn_size=16, num_blocks=5, mlp="swiglu",
              num_experts=4, experts_per_token=2, expert_feedforward=32, moe_every=2)
    assert (m.moe_blocks, m.dense_blocks) == (2, 3)
    assert m.total_params == 3 * m.block_params + 2 * m.moe_block_params + m.embedding_params + m.output_params


FIELDS = dict(hidden=64, feedforward=256, seq_size=32, attn_heads=4, attn_size=16, num_blocks=4)


@pytest.mark.parametrize("change, message", [
    ({"experts_per_token": 2}, "experts_per_token(2) given with num_experts(0), a dense model: give num_experts too"),
    ({"moe_every": 2}, "moe_every(2) given with num_experts(0)"),
    ({"num_experts": 8, "experts_per_token": 9, "expert_feedforward": 32},
     "experts_per_token(9) must be 1 to num_experts(8)"),
    ({"num_experts": 8, "experts_per_token": 2}, "expert_feedforward(0) with num_experts(8)"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_feedforward": 32, "shared_experts": 1},
     "shared_experts(1) with shared_expert_feedforward(0): give both or neither"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_feedforward": 32, "shared_expert_gate": True},
     "shared_expert_gate(True) with shared_experts(0)"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_feedforward": 32, "moe_every": 5},
     "moe_every(5) > num_blocks(4)"),
    ({"num_experts": 1 << 17, "experts_per_token": 2, "expert_feedforward": 32}, "above 65,536"),
    ({"router_fp32": True}, "router_fp32(True) given with num_experts(0)"),
    ({"router_load_balancing": "seq_aux_loss", "router_expert_bias": True},
     "router_load_balancing('seq_aux_loss'), router_expert_bias(True) given with num_experts(0)"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_feedforward": 32, "router_load_balancing": "sinkhorn"},
     "router_load_balancing"),
])
def test_bad_expert_fields_are_one_line_errors(write_file, change, message):
    path = write_file("moe.json", json.dumps({**FIELDS, **change}))
    with pytest.raises(InputError) as err:
        load_model(path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def _qwen_moe(tmp_path, **changes) -> Path:
    config = json.loads((MODELS / "qwen1.5-moe-a2.7b" / "config.json").read_text())
    path = tmp_path / "q" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**config, **changes}))
    return path


def test_decoder_sparse_step_and_mlp_only_layers(tmp_path):
    m = load_model(_qwen_moe(tmp_path, decoder_sparse_step=2, mlp_only_layers=[0, 2]), seq_size=4096)
    assert (m.moe_every, m.moe_blocks, m.dense_blocks, m.feedforward) == (2, 12, 12, 5632)
    with pytest.raises(InputError, match=r"mlp_only_layers \[3, 4\] makes layers \[3\] dense among those "
                                         r"decoder_sparse_step 2 makes sparse: not modelled"):
        load_model(_qwen_moe(tmp_path, decoder_sparse_step=2, mlp_only_layers=[3, 4]), seq_size=4096)
    with pytest.raises(InputError, match=r"field 'mlp_only_layers' 'none' is not a list of layer indices"):
        load_model(_qwen_moe(tmp_path, mlp_only_layers="none"), seq_size=4096)
    with pytest.raises(InputError, match=r"field 'decoder_sparse_step' 0 is not a whole number >= 1"):
        load_model(_qwen_moe(tmp_path, decoder_sparse_step=0), seq_size=4096)
    dense = load_model(_qwen_moe(tmp_path, num_experts=0), seq_size=4096)
    assert (dense.num_experts, dense.moe_blocks, dense.shared_experts) == (0, 0, 0)


def test_missing_expert_fields_are_named(tmp_path):
    config = json.loads((MODELS / "mixtral-8x7b" / "config.json").read_text())
    del config["num_local_experts"]
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"missing field 'num_local_experts' \(a mixtral config.json states it\)"):
        load_model(path, seq_size=4096)


def test_only_unread_expert_fields_warn(tmp_path):
    # A llama config naming experts is not read as a mixture of experts: the warning says so.
    config = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
    path = tmp_path / "l" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**config, "num_local_experts": 8}))
    with pytest.warns(UnmodelledFieldWarning, match="num_local_experts 8: mixture-of-experts layers are not modelled"):
        load_model(path, seq_size=4096)
    with pytest.warns(UnmodelledFieldWarning, match="sliding_window 4096 < seq_size 8192"):
        load_model(_qwen_moe(tmp_path, use_sliding_window=True, sliding_window=4096), seq_size=8192)
