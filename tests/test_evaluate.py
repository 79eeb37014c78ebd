"""Properties of the exact cost model: the scalar and array paths agree, the breakdown adds
up, memory follows the parallelism, and known closed forms hold."""

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.encoding import MappingArrays
from costmodel.evaluate import (capacity_fits, evaluate, evaluate_arrays, evaluate_arrays_in_context,
                                iteration_time_in_context, memory_in_context)
from costmodel.terms.context import Context
from costmodel.terms.iteration import TIME_TERMS
from costmodel.inputs.load import load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from tests.strategies import mappings, models, systems


@st.composite
def problems(draw):
    model = draw(models())
    system = draw(systems())
    batch = draw(st.lists(mappings(model, system), min_size=1, max_size=6))
    kernel = {"datatype": batch[0].datatype, "fused_attention": batch[0].fused_attention,
              "grad_datatype": batch[0].grad_datatype, "cuda_graphs": batch[0].cuda_graphs,
              "fused_cross_entropy": batch[0].fused_cross_entropy, "fused_activation": batch[0].fused_activation}
    batch = [m.model_copy(update=kernel) for m in batch]
    return model, system, batch


@settings(max_examples=60, deadline=None)
@given(problems())
def test_scalar_and_array_evaluators_agree(problem):
    model, system, batch = problem
    scalar = [evaluate(model, system, m) for m in batch]
    arrays = evaluate_arrays(model, system, MappingArrays.from_mappings(batch), batch[0].datatype,
                             batch[0].kernels)
    for i, ev in enumerate(scalar):
        assert ev.feasible == bool(arrays.feasible[i])
        for name in ("iteration_time_s", "mfu", "hfu", "hbm_bytes", "offload_bytes"):
            assert math.isclose(getattr(ev, name), float(getattr(arrays, name)[i]), rel_tol=1e-12, abs_tol=1e-9), name
        for name, value in ev.time.as_dict().items():
            assert math.isclose(value, float(getattr(arrays.terms, name)[i]), rel_tol=1e-12, abs_tol=1e-12), name


@settings(max_examples=60, deadline=None)
@given(problems())
def test_the_memory_side_alone_decides_capacity_as_the_whole_evaluation(problem):
    """The search's capacity check on the memory terms alone (capacity_fits of memory_in_context's
    bytes) is the whole evaluation's hbm_capacity and offload_capacity checks, mapping by
    mapping, and those bytes are the whole evaluation's, to the last bit."""
    model, system, batch = problem
    arrays = MappingArrays.from_mappings(batch)
    c = Context.build(model, system, batch[0].datatype, batch[0].kernels)
    whole = evaluate_arrays_in_context(c, arrays)
    expected = whole.checks["hbm_capacity"] & whole.checks["offload_capacity"]
    alone_bytes = memory_in_context(c, arrays)
    assert np.array_equal(np.broadcast_to(capacity_fits(c, *alone_bytes), expected.shape), expected)
    for alone, held in zip(alone_bytes, (whole.hbm_bytes, whole.offload_bytes)):
        assert np.array_equal(np.broadcast_to(alone, held.shape), held)


@settings(max_examples=60, deadline=None)
@given(problems())
def test_the_time_side_alone_is_the_whole_evaluations_time(problem):
    """iteration_time_in_context (what the search times once capacity is decided) is the whole
    evaluation's iteration time, to the last bit."""
    model, system, batch = problem
    arrays = MappingArrays.from_mappings(batch)
    c = Context.build(model, system, batch[0].datatype, batch[0].kernels)
    assert np.array_equal(iteration_time_in_context(c, arrays), evaluate_arrays_in_context(c, arrays).iteration_time_s)


@settings(max_examples=60, deadline=None)
@given(problems())
def test_time_breakdown_adds_up(problem):
    model, system, batch = problem
    for mapping in batch:
        ev = evaluate(model, system, mapping)
        assert all(getattr(ev.time, k) >= 0 for k in TIME_TERMS)
        assert math.isclose(sum(ev.time.as_dict().values()), ev.iteration_time_s, rel_tol=1e-9)
        assert 0 < ev.mfu <= ev.hfu < 1


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_memory_never_grows_when_tp_or_pp_grows(data):
    model = data.draw(models())
    system = data.draw(systems(offload=False))
    base = data.draw(mappings(model, system)).model_copy(update={"data_par": 1, "pipeline_interleaving": 1})
    base = Mapping.model_validate({**base.model_dump(), "num_procs": base.tp * base.cp * base.pp,
                                   "batch_size": base.microbatch_size * 4, "tensor_par_comm_type": "ar"})
    ev = evaluate(model, system, base)
    for field, factor in (("tensor_par", 2), ("pipeline_par", 2)):
        bigger = base.model_dump()
        bigger[field] *= factor
        bigger["num_procs"] *= factor
        if (field == "tensor_par" and (model.attn_heads % bigger[field] or model.hidden % bigger[field]
                                       or model.kv_groups % bigger[field] or model.feedforward % bigger[field])) or \
           (field == "pipeline_par" and model.num_blocks % bigger[field]):
            continue
        ev2 = evaluate(model, system, Mapping.model_validate(bigger))
        assert ev2.hbm_bytes <= ev.hbm_bytes * (1 + 1e-12), field


def test_parameter_memory_is_18_bytes_per_parameter_with_16_bit_weights():
    # Korthikanti et al. 2022 Fig. 1: 2 (fp16 weight) + 4 (fp32 grad) + 12 (fp32 master + Adam).
    model = Model(hidden=4096, feedforward=16384, seq_size=2048, attn_heads=32, attn_size=128, num_blocks=32)
    from costmodel.inputs.load import load_system
    from pathlib import Path
    system = load_system(Path(__file__).resolve().parents[1] / "problems/systems/a100-80g-selene.yaml")
    mapping = Mapping(num_procs=8, tensor_par=2, pipeline_par=4, data_par=1, batch_size=8, microbatch_size=1,
                      datatype="float16", pipeline_par_net=0)
    mem = evaluate(model, system, mapping).memory.as_dict()
    params = model.num_blocks * model.block_params / 8
    assert mem["weights_bytes"] == pytest.approx(2 * params)
    assert mem["weight_grads_bytes"] == pytest.approx(4 * params)
    assert mem["optimizer_bytes"] == pytest.approx(12 * params)


def test_model_flops_match_megatron_formula():
    # Narayanan et al. 2021, eq. (3): 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)) per batch of B.
    model = Model(hidden=12288, feedforward=49152, seq_size=2048, attn_heads=96, attn_size=128, num_blocks=96)
    h, s, L, V = 12288, 2048, 96, 51200
    expected = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    f = model.model_flops()
    assert (f.matrix_per_token + f.full_attention_per_token) * s == pytest.approx(expected, rel=1e-12)
    # MFU's numerator halves the attention term s/(6h) for the causal mask (Megatron-Bridge's count)
    causal = 72 * s * L * h * h * (1 + s / (12 * h) + V / (12 * h * L))
    assert model.model_flops_per_sample() == pytest.approx(causal, rel=1e-12)


def test_offload_moves_state_out_of_hbm():
    from pathlib import Path
    from costmodel.inputs.load import load_system
    system = load_system(Path(__file__).resolve().parents[1] / "problems/systems/a100-80g-selene.yaml")
    system = system.with_overrides(offload_gib=512, offload_gbps=100)
    model = Model(hidden=4096, feedforward=16384, seq_size=2048, attn_heads=32, attn_size=128, num_blocks=32)
    plain = Mapping(num_procs=8, tensor_par=8, pipeline_par=1, data_par=1, batch_size=8, microbatch_size=1,
                    datatype="float16")
    off = plain.model_copy(update={"weight_offload": True, "optimizer_offload": True, "activations_offload": True})
    a, b = evaluate(model, system, plain), evaluate(model, system, off)
    assert b.hbm_bytes < a.hbm_bytes
    assert b.offload_bytes > 0 and a.offload_bytes == 0
    assert b.iteration_time_s >= a.iteration_time_s
    # everything that left HBM is in tier 2 (HBM keeps two blocks of weights and activations)
    assert b.hbm_bytes + b.offload_bytes > a.hbm_bytes


def test_arrays_roundtrip_to_mappings():
    model = Model(hidden=1024, feedforward=4096, seq_size=1024, attn_heads=16, attn_size=64, num_blocks=8)
    m = Mapping(num_procs=16, tensor_par=2, pipeline_par=4, data_par=2, batch_size=8, microbatch_size=2,
                pipeline_interleaving=2, tensor_par_comm_type="rs_ag", seq_par_ag_redo=True, datatype="bfloat16",
                activation_recompute="attn_only", tensor_par_overlap="pipe", optimizer_sharding=True)
    arrays = MappingArrays.from_mappings([m, m])
    assert len(arrays) == 2
    assert arrays.to_mapping(1, m.datatype) == m.with_model_defaults(False)   # a dense model's etp is 1
    assert np.all(arrays.take(np.array([True, False])).tp == 2)
    del model


SELENE = Path(__file__).resolve().parents[1] / "problems/systems/a100-80g-selene.yaml"


def one_gpu_mapping(**fields) -> Mapping:
    return Mapping(**{"num_procs": 1, "tensor_par": 1, "pipeline_par": 1, "data_par": 1, "batch_size": 2,
                      "microbatch_size": 2, "datatype": "float16", **fields})


@pytest.mark.parametrize("fused", [False, True])
def test_stored_activations_follow_korthikanti_with_and_without_fused_attention(fused):
    # Korthikanti et al. 2022 §4.1, 16-bit, no parallelism, nothing recomputed:
    # s·b·h·(34 + 5·a·s/h) bytes per block. A fused kernel stores no score matrix (the 5·a·s²·b
    # term) but one fp32 log-sum-exp per query row and head: 4·a·s·b.
    model = Model(hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=4)
    s, b, h, a, L = 2048, 2, 2048, 16, 4
    system = load_system(SELENE)
    ev = evaluate(model, system, one_gpu_mapping(fused_attention=fused))
    core = 4 * a * s * b if fused else 5 * a * s * s * b
    assert ev.memory.activations_bytes == pytest.approx(L * (34 * s * b * h + core), rel=1e-12)


def test_fused_attention_makes_selective_recompute_a_no_op():
    # The fused backward kernel recomputes the scores itself; there is nothing for
    # attn_only to drop or redo, so it costs exactly what no recomputation costs.
    model = Model(hidden=2048, feedforward=8192, seq_size=4096, attn_heads=16, attn_size=128, num_blocks=4)
    system = load_system(SELENE)
    none = evaluate(model, system, one_gpu_mapping(activation_recompute="none"))
    selective = evaluate(model, system, one_gpu_mapping(activation_recompute="attn_only"))
    assert selective.iteration_time_s == pytest.approx(none.iteration_time_s, rel=1e-12)
    assert selective.hbm_bytes == pytest.approx(none.hbm_bytes, rel=1e-12)
    unfused = [evaluate(model, system, one_gpu_mapping(activation_recompute=r, fused_attention=False))
               for r in ("none", "attn_only")]
    assert unfused[1].iteration_time_s > unfused[0].iteration_time_s and unfused[1].hbm_bytes < unfused[0].hbm_bytes


def test_fused_attention_hardware_flops_count_the_in_kernel_recompute():
    # With no recomputation of our own, HFU exceeds MFU only by the Q·Kᵀ GEMM the fused
    # backward redoes: 2·s²·h FLOP per block per sequence (a·d = h), halved for the causal mask
    # as MFU counts the attention.
    model = Model(hidden=2048, feedforward=8192, seq_size=4096, attn_heads=16, attn_size=128, num_blocks=4)
    s, h, L = 4096, 2048, 4
    system = load_system(SELENE)
    ev = evaluate(model, system, one_gpu_mapping())
    assert ev.hfu / ev.mfu - 1 == pytest.approx(L * s * s * h / model.model_flops_per_sample(), rel=1e-12)
    unfused = evaluate(model, system, one_gpu_mapping(fused_attention=False))
    assert unfused.hfu == pytest.approx(unfused.mfu, rel=1e-12)


def test_fused_attention_removes_the_score_traffic_at_long_sequences():
    # At s = 8192 the unfused softmax and dropout move 2·(2e + 1)·a·s²·b bytes per block forward,
    # more than the GEMMs take: fusing must make the iteration faster, and recomputation cheaper.
    model = Model(hidden=4096, feedforward=16384, seq_size=8192, attn_heads=32, attn_size=128, num_blocks=4)
    system = load_system(SELENE)
    fused = evaluate(model, system, one_gpu_mapping(batch_size=1, microbatch_size=1))
    unfused = evaluate(model, system, one_gpu_mapping(batch_size=1, microbatch_size=1, fused_attention=False))
    assert fused.time.forward_s < 0.8 * unfused.time.forward_s
    assert fused.mfu > unfused.mfu


def test_a_mapping_files_attention_type_is_read_into_the_model():
    # Calculon's multiquery = kv_heads 1 on the model; the scalar path (which reads the
    # mapping file's setting) and the array path (which reads only the model) agree.
    model = Model(hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=4)
    multiquery = model.model_copy(update={"kv_heads": 1})
    system = load_system(SELENE)
    as_text = evaluate(model, system, one_gpu_mapping(attention_type="multiquery"))
    on_model = evaluate(multiquery, system, one_gpu_mapping())
    arrays = evaluate_arrays(multiquery, system, MappingArrays.from_mappings([one_gpu_mapping()]),
                             one_gpu_mapping().datatype)
    assert as_text.iteration_time_s == pytest.approx(on_model.iteration_time_s, rel=1e-12)
    assert float(arrays.iteration_time_s[0]) == pytest.approx(on_model.iteration_time_s, rel=1e-12)
    assert on_model.iteration_time_s < evaluate(model, system, one_gpu_mapping()).iteration_time_s
    # multihead says nothing new about a model without kv_heads, nor about a grouped-query one
    gqa = model.model_copy(update={"kv_heads": 4})
    assert evaluate(gqa, system, one_gpu_mapping(attention_type="multihead")).iteration_time_s == \
        pytest.approx(evaluate(gqa, system, one_gpu_mapping()).iteration_time_s, rel=1e-12)


def test_attention_type_that_contradicts_the_model_is_one_line_error():
    from costmodel.errors import InputError
    model = Model(hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=4,
                  kv_heads=4)
    with pytest.raises(InputError, match=r"attention_type: the mapping says multiquery but model .* states kv_heads 4"):
        evaluate(model, load_system(SELENE), one_gpu_mapping(attention_type="multiquery"))


def test_multiquery_allows_only_tp_1():
    # Megatron-LM's rule: tp divides the key/value heads; with one there is no split.
    from costmodel.errors import InputError
    model = Model(hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=4)
    mapping = Mapping(num_procs=2, tensor_par=2, pipeline_par=1, data_par=1, batch_size=2, microbatch_size=2,
                      datatype="float16", attention_type="multiquery")
    with pytest.raises(InputError, match=r"tensor_par\(2\) does not divide kv_heads\(1\)"):
        evaluate(model, load_system(SELENE), mapping)
