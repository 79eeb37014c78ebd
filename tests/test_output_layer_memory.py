"""The output side of the model in memory: the output layer and the fp32 logits on the last
pipeline stage, untied embeddings on the first and last, and the runtime reserve every GPU
keeps — with their closed forms."""

from pathlib import Path

import pytest

from costmodel.evaluate import evaluate
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.system import RUNTIME_RESERVE_GIB
from costmodel.inputs.units import GiB
from solver.study.batch import load_batch

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
H100_STEP_CURVES = load_system(ROOT / "problems/systems/h100-80g-nvl8-paper2023.yaml")
LLAMA_8B = load_model(ROOT / "problems/models/llama-3.1-8b/config.json", seq_size=8192)


def mapping(tp: int, pp: int, **fields) -> Mapping:
    return Mapping(**{"num_procs": tp * pp, "tensor_par": tp, "pipeline_par": pp, "data_par": 1, "batch_size": 8,
                      "microbatch_size": 1, "tensor_par_comm_type": "rs_ag", **fields})


def test_logits_are_kept_in_fp32_with_a_16_bit_gradient_on_the_last_stage():
    # b·s·V/tp logits × (4 + 2) bytes, and the output GEMM's input b·s·h (÷ tp with SP) in bf16
    ev = evaluate(LLAMA_8B, H100, mapping(8, 4))
    s, V, h, t = 8192, 128256, 4096, 8
    assert ev.memory.logits_bytes == pytest.approx(s * V / t * 6 + 2 * s * h / t, rel=1e-12)
    assert ev.memory.logits_bytes / GiB == pytest.approx(0.75, abs=0.01)


def test_untied_output_layer_is_on_the_last_stage_and_both_on_one_stage():
    state = 2 + 4 + 12                                        # bf16 weight, fp32 grad, fp32 master + Adam
    V, h, t = 128256, 4096, 8
    split = evaluate(LLAMA_8B, H100, mapping(8, 4)).memory.as_dict()
    assert split["embedding_bytes"] == pytest.approx(V * h / t * state, rel=1e-12)             # first stage
    assert split["output_layer_bytes"] == pytest.approx((V * h / t + h) * state, rel=1e-12)    # last stage
    first = split["first_stage_hbm_bytes"]
    last = split["last_stage_hbm_bytes"]
    assert first - last == pytest.approx(split["activations_bytes"] - split["last_stage_activations_bytes"]
                                         + split["embedding_bytes"] - split["output_layer_bytes"]
                                         - split["logits_bytes"], rel=1e-9)
    one = evaluate(LLAMA_8B, H100, mapping(8, 1))
    assert one.memory.first_stage_hbm_bytes == pytest.approx(one.memory.last_stage_hbm_bytes)
    assert one.hbm_bytes == pytest.approx(sum(getattr(one.memory, k) for k in (
        "weights_bytes", "weight_grads_bytes", "optimizer_bytes", "embedding_bytes", "activations_bytes",
        "activation_workspace_bytes", "output_layer_bytes", "logits_bytes", "runtime_reserve_bytes")), rel=1e-12)


def test_tied_embeddings_need_a_copy_on_the_last_stage_only_when_pipelined():
    tied = LLAMA_8B.model_copy(update={"tied_embeddings": True})
    assert evaluate(tied, H100, mapping(8, 1)).memory.output_layer_bytes == pytest.approx(4096 * 18)
    assert evaluate(tied, H100, mapping(8, 4)).memory.output_layer_bytes > 128256 * 4096 / 8 * 18


def test_the_last_stage_can_be_the_fuller_one():
    # a shallow pipeline of a large-vocabulary model: 2 microbatches in flight on the first
    # stage, one plus the logits and the output layer on the last
    ev = evaluate(LLAMA_8B, H100, mapping(8, 2, batch_size=2, activation_recompute="full"))
    assert ev.memory.last_stage_hbm_bytes > ev.memory.first_stage_hbm_bytes
    assert ev.hbm_bytes == ev.memory.last_stage_hbm_bytes


def test_runtime_reserve_is_counted_against_hbm_and_can_be_set():
    with_reserve = evaluate(LLAMA_8B, H100, mapping(8, 4))
    without = evaluate(LLAMA_8B, H100.model_copy(update={"runtime_reserve_gib": 0.0}), mapping(8, 4))
    assert with_reserve.memory.runtime_reserve_bytes == RUNTIME_RESERVE_GIB * GiB
    assert with_reserve.hbm_bytes - without.hbm_bytes == pytest.approx(RUNTIME_RESERVE_GIB * GiB)


def test_paper_batches_count_no_reserve_and_a_varied_reserve_tags_the_id(tmp_path):
    for path in sorted((ROOT / "problems/paper").glob("*.yaml")):
        assert {p.system.runtime_reserve_gib for p in load_batch(path)} == {0.0}, path.name
    batch = tmp_path / "b.yaml"
    batch.write_text(f"models: {ROOT / 'problems/models/gpt-1.3b.yaml'}\nsystems: {ROOT / 'problems/systems/h100-80g-nvl8.yaml'}\n"
                     "gpus: 8\noverrides: {runtime_reserve_gib: [0, 4]}\n")
    assert [p.id for p in load_batch(batch)] == ["gpt-1.3b__h100-80g-nvl8-rr0__g8__bf16",
                                                 "gpt-1.3b__h100-80g-nvl8-rr4__g8__bf16"]


def test_an_untied_output_layer_is_reduced_and_stepped_too():
    # pp = 1: the optimizer steps over blocks + embedding + output layer; tied, the output
    # layer is the embedding. The step is HBM-bound: its time scales with the parameters (on
    # step curves; a calibrated file adds a fixed per-kernel latency, so use the 2023 one).
    tied = LLAMA_8B.model_copy(update={"tied_embeddings": True})
    step = {name: evaluate(m, H100_STEP_CURVES, mapping(8, 1)).time.optimizer_s
            for name, m in (("untied", LLAMA_8B), ("tied", tied))}
    blocks = 32 * LLAMA_8B.block_params
    V_h = 128256 * 4096
    assert step["untied"] / step["tied"] == pytest.approx((blocks + 2 * V_h) / (blocks + V_h), rel=1e-9)
