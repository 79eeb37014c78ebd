"""The MoE layer's kernel inventory (costmodel.terms.moe_kernels) and RoPE run unfused
(costmodel.terms.attention.unfused_rope_s): what the formulas time beside the bulk kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.system import Datatype
from costmodel.ops import ScalarOps
from costmodel.terms.attention import unfused_rope_s
from costmodel.terms.context import Context
from costmodel.terms.moe import fp32_router_backward_s
from costmodel.terms.moe_kernels import moe_launches, router_extra_bytes

ROOT = Path(__file__).resolve().parents[1]
GPT_OSS = load_model(ROOT / "problems/models/gpt-oss-120b/config.json", seq_size=4096)
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")


def _context(graphs: str = "none", model=GPT_OSS, **kernels) -> Context:
    return Context.build(model, H100, Datatype.bfloat16, Kernels(cuda_graphs=graphs, **kernels))


def _gpt_oss_forward_kernels(local: int) -> int:
    """Megatron-Core core_r0.17.0's forward of a gpt-oss MoE layer (BF16, all-to-all dispatcher,
    fused router and permute, expert biases, clamped quick-GeGLU), counted from the code
    (force-balancing noise of benchmark runs aside): router GEMM 1, fused top-k 1, preprocess
    6 + 4 device-to-host copies, fused permute 4, sort 2, fc1 L, 2 clamps + cat + the offset's copy
    + the compiled activation 5, fc2 L, _apply_bias 2L + 1, unsort 3, unpermute 1."""
    return 1 + 1 + 6 + 4 + 4 + 2 + local + 5 + local + (2 * local + 1) + 3 + 1


def _gpt_oss_backward_kernels(local: int) -> int:
    """Its backward (the activation's recompute apart, rerun by recompute_modules moe_act):
    unpermute, unsort, sort, permute 4; fc1 and fc2 gradients 4L; the activation's 1 + 10;
    _apply_bias 4L + 3 and the bias gradients' main-gradient adds 2L; router GEMMs 2, top-k
    backward 1, gradient merge 1, the router weight's add 1, its bias's sum and add 2."""
    return 4 + 4 * local + 11 + (4 * local + 3) + 2 * local + 2 + 1 + 1 + 1 + 2


@pytest.mark.parametrize("ep", [8, 64])
def test_gpt_oss_layer_launches_every_kernel_of_megatron_core(ep):
    local = 128 // ep
    launches = moe_launches(_context(), ScalarOps, float(local))
    assert launches.forward_kernels == _gpt_oss_forward_kernels(local)
    assert launches.backward_kernels == _gpt_oss_backward_kernels(local)


def test_cuda_graphs_take_the_launch_gap_where_they_capture():
    """Eager: every untimed kernel pays its latency and the gap, each host sync a gap; per-layer
    graphs capture the router and the preprocess only; a full-iteration graph everything."""
    eager, per_layer, full = (moe_launches(_context(graphs), ScalarOps, 16.0)
                              for graphs in ("none", "per-layer", "full-iteration"))
    assert eager.forward_s > per_layer.forward_s > full.forward_s > 0
    c_full, c_eager = _context("full-iteration"), _context()
    latency = c_full.memory.hbm_latency_s
    assert c_eager.memory.hbm_latency_s - c_eager.step.kernel_gap_s == pytest.approx(latency)
    untimed = eager.forward_kernels - (3 + 2 + 1 + 4)      # router 3, expert GEMMs 2, activation 1, permutes 4
    assert full.forward_s == pytest.approx(untimed * latency, rel=1e-12)
    syncs = 2                                              # the splits' d2h_event, the clamp offset's copy
    assert eager.forward_s == pytest.approx(untimed * (latency + c_eager.step.kernel_gap_s) + syncs * c_eager.step.kernel_gap_s,
                                            rel=1e-12)


def test_a_model_without_biases_or_clamp_launches_fewer():
    plain = GPT_OSS.model_copy(update={"bias": False, "qkv_bias": False, "clamped_activation": False,
                                       "router_bias": False})
    ours, theirs = moe_launches(_context(model=plain), ScalarOps, 16.0), moe_launches(_context(), ScalarOps, 16.0)
    assert theirs.forward_kernels - ours.forward_kernels == (2 * 16 + 1) + 4
    assert ours.activation_s == 0.0 < theirs.activation_s


def test_the_flex_dispatcher_launches_hybrideps_kernels():
    """HybridEP (DeepEP 34152ae): forward 12 kernels beside its communication (memset, scan,
    permute_preprocessing, pad_tokens_per_expert; the dispatch's update and two device syncs; the
    permute; the combine's unpermute, update and two device syncs) where the all-to-all path has its
    preprocess (6 + 4 copies), fused permute 4, sort 2, unsort 3 and unpermute 1; backward 8 where
    it has 4."""
    alltoall = moe_launches(_context(), ScalarOps, 16.0)
    flex = moe_launches(_context(moe_dispatcher="flex", moe_flex_backend="hybridep"), ScalarOps, 16.0)
    assert alltoall.forward_kernels - flex.forward_kernels == (6 + 4) + (4 + 2 + 3 + 1) - 12
    assert flex.backward_kernels - alltoall.backward_kernels == 8 - 4


def _deepep_forward_kernels() -> int:
    """Megatron-Core core_r0.17.0 _DeepepManager and fused_a2a.py with TE 2.12, counted from the
    code: setup_metadata's topk 1; get_dispatch_layout, notify_dispatch, dispatch 3;
    _indices_to_multihot (experimental fusions off): zeros 2, `indices != -1` 1, `indices[mask]` 2,
    arange 1, mask.sum 1, repeat_interleave 2, index_put 2, `probs[mask]` 2, .bool() 1 = 14;
    moe_permute_and_pad_with_probs: copy to the GPU, divide, ceil, multiply, long, torch.equal,
    sum for .item() = 7, row-id map 3 + permute 1; unpermute 1; cached_notify_combine, combine 2."""
    return 1 + 3 + (2 + 1 + 2 + 1 + 1 + 2 + 2 + 2 + 1) + 7 + (3 + 1) + 1 + 2


def test_deepep_launches_its_own_kernels_and_waits_on_the_host_six_times():
    """DeepEP against HybridEP on the same layer: 32 forward kernels against 12, 13 backward against
    8, and 6 host syncs a forward against 1 (notify_dispatch's counts; the two masked gathers and
    repeat_interleave; torch.equal and .item() in the padded permute): each extra kernel costs its
    latency and the launch gap, each extra sync one gap (no CUDA graphs)."""
    hybrid_c = _context(moe_dispatcher="flex", moe_flex_backend="hybridep")
    deep_c = _context(moe_dispatcher="flex", moe_flex_backend="deepep")
    hybrid, deep = moe_launches(hybrid_c, ScalarOps, 16.0), moe_launches(deep_c, ScalarOps, 16.0)
    assert _deepep_forward_kernels() == 32
    assert deep.forward_kernels - hybrid.forward_kernels == _deepep_forward_kernels() - 12
    assert deep.backward_kernels - hybrid.backward_kernels == 13 - 8
    gap = deep_c.step.kernel_gap_s + deep_c.step.outer_gap_extra_s
    latency = deep_c.memory.hbm_latency_s - deep_c.step.kernel_gap_s
    assert deep.forward_s - hybrid.forward_s == pytest.approx((32 - 12) * (latency + gap) + (6 - 1) * gap, rel=1e-12)
    assert Kernels().moe_flex_backend == "deepep"       # Megatron-LM's default moe_flex_dispatcher_backend


def test_unfused_rope_is_twelve_element_bytes_and_its_table_kernels():
    """Per tensor: t·cos (2e), −x₂ (e over half: e), cat (2e), ·sin (2e), add (3e), cat (2e) =
    12 bytes of e per element, plus 6 kernels on the frequency table (latency only)."""
    c = _context("full-iteration")
    q, k = 4096.0 * 4096, 4096.0 * 512
    time_s = unfused_rope_s(c, ScalarOps, q, k)
    assert time_s > 12 * c.memory.hbm_latency_s
    bytes_moved = 12 * c.precision.elem_bytes * (q + k)
    assert time_s - 24 * c.memory.hbm_latency_s == pytest.approx(bytes_moved / c.memory.hbm_bytes_per_s, rel=0.5)


def test_yarn_is_read_and_runs_unfused_outside_latent_attention():
    assert GPT_OSS.yarn_rope and GPT_OSS.clamped_activation and _context().model.unfused_rope
    deepseek = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=4096)
    llama = load_model(ROOT / "problems/models/llama-3.1-8b/config.json", seq_size=4096)
    assert not _context(model=deepseek).model.unfused_rope       # latent attention: its own fused RoPE
    assert not llama.yarn_rope                             # rope_type llama3: the plain rotary kernel


DEEPSEEK = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=4096)


def test_the_router_is_trained_as_megatron_bridges_model_bridges_set_it():
    """DeepSeek-V3 (deepseek_v3_bridge.py: seq_aux_loss at 1e-4, moe_router_dtype fp32, the expert
    bias); gpt-oss (gpt_oss_bridge.py: load balancing none, the router in the model's BF16)."""
    assert (DEEPSEEK.router_load_balancing, DEEPSEEK.router_fp32, DEEPSEEK.router_expert_bias) == \
        ("seq_aux_loss", True, True)
    assert (GPT_OSS.router_load_balancing, GPT_OSS.router_fp32, GPT_OSS.router_expert_bias) == ("none", False, False)


@pytest.mark.parametrize("kind, forward, backward", [
    # forward: aux scores 1, routing_map.sum 1, fused loss 1, [seq: / bsz 1], / coeff 1, tracker += 1,
    # [global: tokens +=, ga_steps +=, their quotient 3]; backward: ones_like 1, · scale 1, [seq: / bsz 1],
    # the loss's backward 1, the scores' backward 1, the logits' two gradients summed 1
    ("aux_loss", 1 + 1 + 1 + 1 + 1, 1 + 1 + 1 + 1 + 1),
    ("seq_aux_loss", 1 + 1 + 1 + 1 + 1 + 1, 1 + 1 + 1 + 1 + 1 + 1),
    ("global_aux_loss", 1 + 1 + 1 + 1 + 1 + 3, 1 + 1 + 1 + 1 + 1),
])
def test_the_load_balancing_loss_launches_its_kernels(kind, forward, backward):
    plain = moe_launches(_context(), ScalarOps, 16.0)
    lossy = moe_launches(_context(model=GPT_OSS.model_copy(update={"router_load_balancing": kind})), ScalarOps, 16.0)
    assert (lossy.forward_kernels - plain.forward_kernels, lossy.backward_kernels - plain.backward_kernels) == \
        (forward, backward)


def test_expert_bias_counts_tokens_forward_and_a_float32_router_casts_backward():
    """_apply_expert_bias: the routing map's sum and its add (2 forward); a float32 router's backward:
    the weight and the input cast up, the two gradients cast back (4)."""
    plain = moe_launches(_context(), ScalarOps, 16.0)
    bias = moe_launches(_context(model=GPT_OSS.model_copy(update={"router_expert_bias": True})), ScalarOps, 16.0)
    fp32 = moe_launches(_context(model=GPT_OSS.model_copy(update={"router_fp32": True})), ScalarOps, 16.0)
    assert (bias.forward_kernels - plain.forward_kernels, bias.backward_kernels - plain.backward_kernels) == (2, 0)
    assert (fp32.forward_kernels - plain.forward_kernels, fp32.backward_kernels - plain.backward_kernels) == (0, 4)


def test_deepseek_v3s_router_extras_move_these_bytes():
    """DeepSeek-V3 at 4,096 tokens (E 256, h 7168), float32 router (r = 4 bytes): forward the aux
    scores' pass (logits read 4; scores 4, map 1 and intermediate 4 written: 13 bytes a score), the
    loss's map sum (1) and read (4), the expert bias's map sum (1): 19 bytes a score; backward the loss's gradient (4), the scores' backward (12), the two
    gradients' sum (12), and the casts of the 4096 × 7168 input and gradient and the 256 × 7168
    weight and gradient (2 + 4 bytes each way: 12 an element)."""
    c = _context(model=DEEPSEEK)
    tokens, scores = 4096.0, 4096.0 * 256
    forward, backward = router_extra_bytes(c, tokens)
    assert forward == pytest.approx(scores * (13 + 1 + 4 + 1), rel=1e-12)
    assert backward == pytest.approx(scores * (4 + 12 + 12) + 12 * 7168 * (4096 + 256), rel=1e-12)
    assert router_extra_bytes(_context(), tokens) == (0.0, 0.0)          # gpt-oss: none of them


def test_a_float32_routers_backward_gemms_run_at_tf32():
    """The input and weight gradients, 4096 × 256 × 7168 each (15.0 GFLOP), on the H100's float32
    entry (495 TFLOP/s TF32 at its step curve) with float32 operands, in place of two BF16 GEMMs."""
    c = _context(model=DEEPSEEK)
    assert c.compute.router_tf32_flops_per_s == pytest.approx(495e12)
    flops = 2 * 4096 * 256 * 7168
    efficiency = ScalarOps.lookup(c.compute.router_tf32_curve, flops)
    tf32 = max(flops / (495e12 * efficiency), 4 * (4096 * 7168 + 7168 * 256 + 4096 * 256) / c.memory.hbm_bytes_per_s
               / ScalarOps.lookup(c.memory.hbm_curve, 4 * (4096 * 7168 + 7168 * 256 + 4096 * 256)))
    bf16 = 20e-6
    assert fp32_router_backward_s(c, ScalarOps, 4096.0, 256.0, bf16) == \
        pytest.approx(2 * (tf32 + c.step.kernel_gap_s - bf16), rel=1e-12)
    assert fp32_router_backward_s(_context(), ScalarOps, 4096.0, 128.0, bf16) == 0.0
