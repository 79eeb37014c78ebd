"""Today's dense models: Hugging Face config.json files read into the model, their parameter
counts and model FLOPs against the published figures, and the loader's errors and warnings."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.errors import InputError
from costmodel.inputs.hf import UnmodelledFieldWarning
from costmodel.inputs.load import load_model
from solver.cli.app import cli

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "problems" / "models"
H100 = str(ROOT / "problems" / "systems" / "h100-80g-nvl8.yaml")


def hf(name: str, seq_size: int = 8192):
    return load_model(MODELS / name / "config.json", seq_size=seq_size)


# Published totals: the Hugging Face hub's safetensors parameter count of each repository
# (Llama 3.1, Qwen2.5; problems/models/README.md) and the Nemotron-4 340B technical report
# (arXiv:2406.11704 §2.1: 9.4 B embedding + 331.6 B non-embedding parameters).
PUBLISHED_PARAMS = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405.9e9,
                    "qwen2.5-72b": 72.7e9, "nemotron-4-340b": 341e9}


@pytest.mark.parametrize("name", PUBLISHED_PARAMS)
def test_parameter_counts_match_the_published_totals(name):
    assert hf(name).total_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.005)


def test_parameters_are_counted_term_by_term_for_llama_70b():
    # Q and O: 2·h·h; K and V: 2·h·(8·128); gated MLP: 3·h·f; two RMSNorms: 2·h; no biases.
    m = hf("llama-3.1-70b")
    h, f, L, V = 8192, 28672, 80, 128256
    block = 2 * h * h + 2 * h * 1024 + 3 * h * f + 2 * h
    assert m.block_params == block
    assert m.total_params == L * block + 2 * V * h + h      # untied embedding and output layer, final norm
    assert (m.kv_heads, m.mlp, m.norm, m.position, m.tied_embeddings, m.bias) == (8, "swiglu", "rmsnorm", "rope",
                                                                                 False, False)


# NVIDIA's performance tables for its NeMo/Megatron benchmark recipes state the model FLOP per
# sequence they divide by to get MFU (docs.nvidia.com, NeMo Framework performance summary;
# the same convention as Megatron-LM's num_floating_point_operations): full s² attention.
PUBLISHED_FLOPS = [("llama-3.1-70b", 8192, 3.94e15), ("llama-3.1-405b", 8192, 2.17e16)]


@pytest.mark.parametrize("name, seq, flops", PUBLISHED_FLOPS)
def test_model_flops_per_sequence_match_nvidias_benchmark_figures(name, seq, flops):
    f = hf(name, seq).model_flops()
    full = (f.matrix_per_token + f.full_attention_per_token) * seq   # their count: the full s²
    assert full == pytest.approx(flops, rel=0.02)


def test_gpt3_model_flops_per_sequence_match_nvidias_figure():
    f = load_model(MODELS / "gpt3-175b.yaml").model_flops()
    assert (f.matrix_per_token + f.full_attention_per_token) * 2048 == pytest.approx(2.20e15, rel=0.02)


def test_model_flops_are_stated_term_by_term():
    # 6 × matrix parameters per token + 3 passes × (Q·Kᵀ and ·V: 2 × 2·s·a·d) × L, halved for the
    # causal mask as Megatron-Bridge's flop_utils.py counts it (a·d·s/2 · 2)
    m = hf("llama-3.1-70b")
    f = m.model_flops()
    assert f.matrix_params == 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 8192 * 128256
    assert f.matrix_per_token == 6 * f.matrix_params
    assert f.attention_per_token == 3 * 4 * 8192 * 8192 * 80 / 2
    assert f.full_attention_per_token == 3 * 4 * 8192 * 8192 * 80
    assert m.model_flops_per_sample() == f.per_token * 8192


def test_grouped_query_attention_shrinks_k_and_v_only():
    m = hf("llama-3.1-8b")
    full = m.model_copy(update={"kv_heads": None})
    assert full.block_weight_params - m.block_weight_params == 2 * 4096 * (4096 - 1024)


def test_qwen2_has_biases_on_q_k_v_only():
    m = hf("qwen2.5-72b")
    assert m.qkv_bias and not m.bias
    assert m.block_vector_params == (8192 + 2 * 1024) + 2 * 8192


def test_a_config_json_without_seq_size_is_a_one_line_error():
    with pytest.raises(InputError, match=r"config.json: a Hugging Face config.json does not state the training "
                                         r"sequence length .* give --seq-size"):
        load_model(MODELS / "llama-3.1-8b" / "config.json")


def test_unsupported_model_type_lists_the_supported_ones(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "deepseek_v2", "hidden_size": 5120}))
    with pytest.raises(InputError) as err:
        load_model(path, seq_size=4096)
    assert str(err.value) == (f"{path}: model_type 'deepseek_v2' is not supported (supported: deepseek_v3, gemma3_text, gpt2, "
                              f"gpt_neox, gpt_oss, llama, llama4_text, mistral, mixtral, nemotron, nemotron_h, qwen2, qwen2_moe, "
                              f"qwen3, qwen3_moe)")


def test_missing_field_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}))
    with pytest.raises(InputError, match=r"missing field 'intermediate_size'"):
        load_model(path, seq_size=4096)


def test_sliding_window_is_named_in_a_warning_only_when_it_binds():
    with pytest.warns(UnmodelledFieldWarning, match=r"sliding_window 4096 < seq_size 8192"):
        hf("mistral-7b", 8192)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmodelledFieldWarning)
        hf("mistral-7b", 4096)
        hf("qwen2.5-72b", 32768)          # use_sliding_window false


def test_gpt2_and_gpt_neox_configs_read_with_their_defaults(tmp_path):
    gpt2 = tmp_path / "gpt2" / "config.json"
    gpt2.parent.mkdir()
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024}))
    m = load_model(gpt2, seq_size=1024)
    # GPT-2 small: 124.4 M parameters (Radford et al. 2019; 124,439,808 in Transformers)
    assert (m.name, m.mlp, m.position, m.tied_embeddings, m.feedforward) == ("gpt2", "gelu", "learned", True, 3072)
    assert m.total_params == 124_439_808
    neox = tmp_path / "neox" / "config.json"
    neox.parent.mkdir()
    neox.write_text(json.dumps({"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
                                "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
                                "use_parallel_residual": True}))
    with pytest.warns(UnmodelledFieldWarning, match="use_parallel_residual"):
        m = load_model(neox, seq_size=2048)
    # GPT-NeoX-20B: 20.55 B parameters (Black et al. 2022, Table 1: 20,554,567,680)
    assert m.total_params == pytest.approx(20_554_567_680, rel=1e-4)


def test_cli_solve_reads_a_config_json_with_seq_size_and_warns_on_one_line():
    runner = CliRunner()
    args = ["count", "--model", str(MODELS / "mistral-7b" / "config.json"), "--system", H100, "--gpus", "8", "--json"]
    missing = runner.invoke(cli, args)
    assert missing.exit_code == 1 and "Traceback" not in missing.output
    assert missing.output.count("\n") == 1 and "give --seq-size" in missing.output
    counted = runner.invoke(cli, [*args, "--seq-size", "8192"])
    assert counted.exit_code == 0, counted.output
    warning = [line for line in counted.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "sliding_window" in warning[0]


def test_cli_solves_llama_3_1_70b_on_512_h100s_certified():
    args = ["solve", "--model", str(MODELS / "llama-3.1-70b" / "config.json"), "--seq-size", "8192",
            "--system", H100, "--gpus", "512", "--json", "--workers", "1",
            "--fix", "cp_comm=p2p", "--fix", "shard=all"]           # as before cp_comm and hybrid sharding
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["certified_optimal"] and doc["gap"] == 0.0
    best = doc["best"]["mapping"]
    assert 8 % best["tensor_par"] == 0                      # tp divides the 8 key/value heads
    assert doc["best"]["memory"]["runtime_reserve_bytes"] == 2 * 2**30


def test_seq_size_replaces_a_model_files_and_batch_files_take_it(tmp_path):
    from solver.study.batch import load_batch
    assert load_model(MODELS / "gpt3-175b.yaml", seq_size=4096).seq_size == 4096
    batch = tmp_path / "b.yaml"
    batch.write_text(f"models: {MODELS / 'llama-3.1-8b' / 'config.json'}\nsystems: {H100}\ngpus: 8\n")
    with pytest.raises(InputError, match=r"give --seq-size \(batch files: seq_size\)"):
        load_batch(batch)
    # the cap pinned: without it the 8,192-token problem's default cap (2,048) tags its id __b2048
    batch.write_text(batch.read_text() + "seq_size: [4096, 8192]\nmax_batch: 3072\n")
    problems = load_batch(batch)
    assert [(p.id, p.model.seq_size) for p in problems] == [("llama-3.1-8b-s4096__h100-80g-nvl8__g8__bf16", 4096),
                                                            ("llama-3.1-8b-s8192__h100-80g-nvl8__g8__bf16", 8192)]
