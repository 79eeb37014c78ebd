"""Properties of the exact cost model: the scalar and array paths agree, the breakdown adds
up, memory follows the parallelism, and known closed forms hold."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.encoding import MappingArrays
from costmodel.evaluate import evaluate, evaluate_arrays
from costmodel.iteration import TIME_TERMS
from costmodel.mapping import Mapping
from costmodel.model import Model
from tests.strategies import mappings, models, systems


@st.composite
def problems(draw):
    model = draw(models())
    system = draw(systems())
    batch = draw(st.lists(mappings(model, system), min_size=1, max_size=6))
    datatype = batch[0].datatype
    batch = [m.model_copy(update={"datatype": datatype}) for m in batch]
    return model, system, batch


@settings(max_examples=60, deadline=None)
@given(problems())
def test_scalar_and_array_evaluators_agree(problem):
    model, system, batch = problem
    scalar = [evaluate(model, system, m) for m in batch]
    arrays = evaluate_arrays(model, system, MappingArrays.from_mappings(batch), batch[0].datatype)
    for i, ev in enumerate(scalar):
        assert ev.feasible == bool(arrays.feasible[i])
        for name in ("iteration_time_s", "mfu", "hfu", "hbm_bytes", "offload_bytes"):
            assert math.isclose(getattr(ev, name), float(getattr(arrays, name)[i]), rel_tol=1e-12, abs_tol=1e-9), name
        for name, value in ev.time_s.items():
            assert math.isclose(value, float(arrays.terms[name][i]), rel_tol=1e-12, abs_tol=1e-12), name


@settings(max_examples=60, deadline=None)
@given(problems())
def test_time_breakdown_adds_up(problem):
    model, system, batch = problem
    for mapping in batch:
        ev = evaluate(model, system, mapping)
        assert all(ev.time_s[k] >= 0 for k in TIME_TERMS)
        assert math.isclose(sum(ev.time_s.values()), ev.iteration_time_s, rel_tol=1e-9)
        assert 0 < ev.mfu <= ev.hfu < 1


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_memory_never_grows_when_tp_or_pp_grows(data):
    model = data.draw(models())
    system = data.draw(systems(offload=False))
    base = data.draw(mappings(model, system)).model_copy(update={"data_par": 1, "pipeline_interleaving": 1})
    base = Mapping.model_validate({**base.model_dump(), "num_procs": base.tp * base.pp,
                                   "batch_size": base.microbatch_size * 4, "tensor_par_comm_type": "ar"})
    ev = evaluate(model, system, base)
    for field, factor in (("tensor_par", 2), ("pipeline_par", 2)):
        bigger = base.model_dump()
        bigger[field] *= factor
        bigger["num_procs"] *= factor
        if (field == "tensor_par" and (model.attn_heads % bigger[field] or model.hidden % bigger[field])) or \
           (field == "pipeline_par" and model.num_blocks % bigger[field]):
            continue
        ev2 = evaluate(model, system, Mapping.model_validate(bigger))
        assert ev2.hbm_bytes <= ev.hbm_bytes * (1 + 1e-12), field


def test_parameter_memory_is_18_bytes_per_parameter_with_16_bit_weights():
    # Korthikanti et al. 2022 Fig. 1: 2 (fp16 weight) + 4 (fp32 grad) + 12 (fp32 master + Adam).
    model = Model(hidden=4096, feedforward=16384, seq_size=2048, attn_heads=32, attn_size=128, num_blocks=32)
    from costmodel.load import load_system
    from pathlib import Path
    system = load_system(Path(__file__).resolve().parents[1] / "problems/systems/a100-80g-selene.yaml")
    mapping = Mapping(num_procs=8, tensor_par=2, pipeline_par=4, data_par=1, batch_size=8, microbatch_size=1,
                      datatype="float16", pipeline_par_net=0)
    mem = evaluate(model, system, mapping).memory_bytes
    params = model.num_blocks * model.block_params / 8
    assert mem["weights_bytes"] == pytest.approx(2 * params)
    assert mem["weight_grads_bytes"] == pytest.approx(4 * params)
    assert mem["optimizer_bytes"] == pytest.approx(12 * params)


def test_model_flops_match_megatron_formula():
    # Narayanan et al. 2021, eq. (3): 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)) per batch of B.
    model = Model(hidden=12288, feedforward=49152, seq_size=2048, attn_heads=96, attn_size=128, num_blocks=96)
    h, s, L, V = 12288, 2048, 96, 51200
    expected = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model.model_flops_per_sample() == pytest.approx(expected, rel=1e-12)


def test_offload_moves_state_out_of_hbm():
    from pathlib import Path
    from costmodel.load import load_system
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
    assert arrays.to_mapping(1, m.datatype) == m
    assert np.all(arrays.take(np.array([True, False])).tp == 2)
    del model
