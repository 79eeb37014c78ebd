"""Pipeline sends overlapped with compute (Megatron's overlap_p2p_comm, `pipeline_comm_overlap` /
`--pp-comm-overlap`): with an interleaved schedule only what exceeds a microbatch's compute stays
exposed; without interleaving nothing changes; the certified optimum still equals brute force;
Megatron-Bridge runs with vp > 1 take it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import plain, solve_equals_brute_force

from costmodel.evaluate import evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_mapping import map_run
from costmodel.measured.run_scoring import RunInputs
from costmodel.inputs.system import Datatype
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
MODEL = Model(name="llama16", hidden=4096, feedforward=11008, seq_size=4096, attn_heads=32, attn_size=128,
              num_blocks=16, kv_heads=8, mlp="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False,
              vocab_size=32000)


def mapping(interleaving: int, overlap: bool, pp_net: int = 1) -> Mapping:
    return Mapping(num_procs=16, tensor_par=2, pipeline_par=8, data_par=1, batch_size=32, microbatch_size=1,
                   pipeline_interleaving=interleaving, tensor_par_comm_type="rs_ag", pipeline_par_net=pp_net,
                   pipeline_comm_overlap=overlap)


@pytest.mark.parametrize("pp_net", [0, 1])
def test_interleaved_sends_hide_behind_the_microbatch(pp_net):
    exposed = evaluate(MODEL, H100, mapping(2, False, pp_net))
    hidden = evaluate(MODEL, H100, mapping(2, True, pp_net))
    # the sends (2·v per microbatch) are far shorter than a microbatch's compute: all hidden
    assert exposed.time.pp_comm_s > 0 and hidden.time.pp_comm_s == 0.0
    # by hand: the pipeline runs (n + bubble) microbatches, each shorter by its sends
    n, p, v = 32, 8, 2
    per_micro = exposed.time.pp_comm_s / n
    bubble = (p - 1) / v
    assert exposed.iteration_time_s - hidden.iteration_time_s == pytest.approx((n + bubble) * per_micro, rel=1e-9)


def test_without_interleaving_the_sends_stay_exposed():
    # Megatron overlaps them only in the interleaved schedule (Bridge batches them otherwise)
    assert evaluate(MODEL, H100, mapping(1, True)).iteration_time_s == \
        evaluate(MODEL, H100, mapping(1, False)).iteration_time_s


def test_the_default_is_the_exposed_sends_and_a_file_states_it_only_when_on():
    assert Mapping.model_validate(mapping(2, False).model_dump()) == mapping(2, False)
    assert "pipeline_comm_overlap" not in mapping(2, False).model_dump()
    assert mapping(2, True).model_dump()["pipeline_comm_overlap"] is True
    assert mapping(2, True).kernels.pp_comm_overlap and "pipeline sends overlapped" in mapping(2, True).kernels.label


def test_solve_equals_brute_force_with_overlapped_sends():
    kernels = Kernels(pp_comm_overlap=True)
    space = plain(get_space("full"))         # as before cp_comm and hybrid sharding
    solve_equals_brute_force(MODEL, H100, 16, 32, space, Datatype.bfloat16, kernels, top_k=2)


def test_bridge_runs_with_virtual_stages_overlap_their_sends():
    inputs = RunInputs()
    runs = {r.name: r for r in read_runs(ROOT / "problems/runs/megatron-bridge-pretraining.json")}
    interleaved = runs["bridge2511_llama3_70b_h100_fp8cs_64"]          # vp 5
    plain = runs["bridge2511_llama3_8b_h100_fp8cs_8"]                  # no pipeline
    assert map_run(interleaved, inputs.model(interleaved), inputs.system(interleaved)).mapping.pipeline_comm_overlap
    assert not map_run(plain, inputs.model(plain), inputs.system(plain)).mapping.pipeline_comm_overlap
