"""A block's stored activations are its layers' records (costmodel.terms.layers.LayerCost's
stored bytes) with the recompute setting applied to the records: for every kind of block (dense,
MoE, latent attention, a Mamba pattern's layers) under every recompute setting, and each
setting drops exactly the bytes the records say — Korthikanti et al. 2022 §4's counts for a
16-bit block with no parallelism, the MLA up projections' outputs from DeepSeek-V3's config."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from costmodel.evaluate import _scalar_fields
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from costmodel.ops import ScalarOps
from costmodel.terms.block import block_layers
from costmodel.terms.block_memory import stored_activations
from costmodel.terms.context import Context

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"

SETTINGS = {
    "none": dict(activation_recompute="none"),
    "full": dict(activation_recompute="full"),
    "attn_only": dict(activation_recompute="attn_only"),
    "modules": dict(activation_recompute="attn_only", recompute_modules=("core_attn", "layernorm", "mlp")),
    "moe_act": dict(activation_recompute="attn_only", recompute_modules=("moe_act", "layernorm")),
    "mla_up_proj": dict(activation_recompute="attn_only", recompute_modules=("mla_up_proj",)),
}
"""The recompute settings (Megatron-LM's recompute_granularity and recompute_modules)."""

# (model, block kinds, the settings it allows)
KINDS = [
    ("gpt3-175b", ("dense",), ("none", "full", "attn_only", "modules")),
    ("mixtral-8x7b", ("moe",), ("none", "full", "attn_only", "modules", "moe_act")),
    ("deepseek-v3", ("dense", "moe"), tuple(SETTINGS)),
    ("nemotron-h-8b", ("mamba", "attention_layer", "mlp_layer"), ("none", "full", "attn_only", "modules")),
    ("nemotron-3-nano-30b-a3b", ("mamba", "attention_layer", "moe_layer"), ("none", "full", "modules", "moe_act")),
]


@cache
def context(name: str, fused: bool = True) -> Context:
    path = PROBLEMS / "models" / (f"{name}.yaml" if name.startswith("gpt3") else f"{name}/config.json")
    model = load_model(path, seq_size=4096) if path.suffix == ".json" else load_model(path)
    c = Context.build(model, load_system(PROBLEMS / "systems" / "h100-80g-nvl8.yaml"), Datatype.bfloat16)
    return replace(c, settings=replace(c.settings, fused_attention=fused), model=replace(c.model, dropout=True))


def view(setting: str, tp: int = 4, seq_par: bool = True, ag_redo: bool = False, moe: bool = False):
    sp = dict(tensor_par_comm_type="rs_ag", seq_par_ag_redo=ag_redo) if seq_par else {}
    return _scalar_fields(Mapping(num_procs=tp, tensor_par=tp, pipeline_par=1, data_par=1, batch_size=2,
                                  microbatch_size=2, **sp, **SETTINGS[setting]), moe)


def records_stored(c: Context, m, kind: str) -> float:
    """A block's stored bytes summed record by record, the recompute setting applied to each."""
    layers = block_layers(c, m, ScalarOps, kind).layers
    split = m.tp if m.seq_par and m.seq_par_ag_redo else 1.0
    if m.recompute_full:
        return layers[0].stored_input_bytes
    total = 0.0
    for layer in layers:
        total += layer.stored_bytes + layer.stored_gathered_bytes / split
        if m.recompute_modules is not None:
            for rerun in layer.modules:
                if rerun.module in m.recompute_modules:
                    total -= rerun.dropped_bytes + rerun.dropped_gathered_bytes / split
        elif m.recompute_attn_only:
            total -= layer.selective_dropped_bytes
    return total


CASES = [(name, kind, setting, fused, ag_redo) for name, kinds, settings in KINDS for kind in kinds
         for setting in settings for fused, ag_redo in ((True, False), (False, True))]


@pytest.mark.parametrize("name,kind,setting,fused,ag_redo", CASES)
def test_a_block_stores_the_sum_of_its_layers_records(name, kind, setting, fused, ag_redo):
    c = context(name, fused)
    m = view(setting, ag_redo=ag_redo, moe=bool(c.model.experts))
    stored = stored_activations(c, m, ScalarOps, kind)
    assert stored.stored == pytest.approx(records_stored(c, m, kind), rel=1e-12)
    assert 0 < stored.stored <= stored.full


@pytest.mark.parametrize("setting", ["none", "attn_only", "modules", "moe_act"])
@pytest.mark.parametrize("fused", [True, False])
def test_a_patterns_layers_store_what_a_transformer_block_stores(setting, fused):
    """A transformer block is an attention layer and an MLP (or MoE) layer of a pattern, norm and
    residual each: their stored bytes add up under every setting but full (which keeps one input
    per block), and recompute_modules layernorm drops one norm output of each."""
    c = context("deepseek-v3", fused)
    m = view(setting, moe=True)
    for block, mixer in (("dense", "mlp_layer"), ("moe", "moe_layer")):
        whole = stored_activations(c, m, ScalarOps, block).stored
        parts = (stored_activations(c, m, ScalarOps, "attention_layer").stored
                 + stored_activations(c, m, ScalarOps, mixer).stored)
        assert whole == pytest.approx(parts, rel=1e-12)
    full = view("full", moe=True)
    assert (stored_activations(c, full, ScalarOps, "attention_layer").stored
            == stored_activations(c, full, ScalarOps, "moe").stored == c.precision.elem_bytes * 2 * 4096 * c.model.hidden / 4)


def korthikanti_context(fused: bool = False) -> Context:
    """A GPT block as Korthikanti et al. 2022 count it: LayerNorm, GeLU MLP of 4h, dropout, 16-bit."""
    model = Model(hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=4)
    return replace(base_context := Context.build(model, load_system(PROBLEMS / "systems" / "a100-80g-selene.yaml"),
                                 Datatype.float16), settings=replace(base_context.settings, fused_attention=fused), model=replace(base_context.model, dropout=True))


@pytest.mark.parametrize("setting,dropped", [
    ("attn_only", lambda s, b, h, a: 5 * a * s * s * b),               # §4.2: softmax out, mask, dropout out
    ("modules", lambda s, b, h, a: 5 * a * s * s * b + 4 * s * b * h + 16 * s * b * h),
    ("full", lambda s, b, h, a: 34 * s * b * h + 5 * a * s * s * b - 2 * s * b * h),  # keeps the block input
])
def test_a_recompute_setting_drops_exactly_what_the_records_say(setting, dropped):
    """Korthikanti et al. 2022 §4 (16-bit, no parallelism): a block stores 34·s·b·h + 5·a·s²·b; the
    attention core is the 5·a·s²·b, the two norms' outputs (the QKV and h→4h inputs) 4·s·b·h, the
    MLP's h→4h output and GeLU output 16·s·b·h, the block's input 2·s·b·h. Each setting drops that,
    and the records name the same bytes module by module."""
    c = korthikanti_context()
    s, b, h, a = 2048, 2, 2048, 16
    m = view(setting, tp=1, seq_par=False)
    stored = stored_activations(c, m, ScalarOps, "dense")
    assert stored.full == 34 * s * b * h + 5 * a * s * s * b
    assert stored.full - stored.stored == dropped(s, b, h, a)
    layers = block_layers(c, m, ScalarOps, "dense")
    by_records = {"core_attn": 5 * a * s * s * b, "layernorm": 4 * s * b * h, "mlp": 16 * s * b * h}
    for module, expected in by_records.items():
        assert sum(layers.module_dropped(module)) == expected
    assert layers.total("selective_dropped_bytes") == 5 * a * s * s * b


def test_a_fused_kernel_keeps_its_statistics_and_moe_act_and_mla_up_proj_drop_their_tensors():
    """A fused kernel's core (4·a·s·b of softmax statistics) stays under attn_only. moe_act drops the
    routed experts' activation output, one of their three (gated) f_e-wide tensors; mla_up_proj the
    up projections' outputs, Q and K (d_qk = 192 each per head) and V (d_v = 128) of 128 heads over
    tp (DeepSeek-V3's config: qk_nope 128 + qk_rope 64, v_head_dim 128)."""
    c = korthikanti_context(fused=True)
    m = view("attn_only", tp=1, seq_par=False)
    stored = stored_activations(c, m, ScalarOps, "dense")
    assert stored.stored == stored.full == 34 * 2048 * 2 * 2048 + 4 * 16 * 2048 * 2
    ds = context("deepseek-v3")
    tokens, tp = 2 * 4096, 4
    up = stored_activations(ds, view("none", moe=True), ScalarOps, "moe")
    mla = stored_activations(ds, view("mla_up_proj", moe=True), ScalarOps, "moe")
    assert up.full - mla.stored == pytest.approx(2 * tokens * 128 * (2 * 192 + 128) / tp, rel=1e-12)
    # one GPU: the T·k routed rows (top-8) through the 2,048-wide experts' activation, 2 bytes each
    one_gpu = view("moe_act", tp=1, seq_par=False, moe=True)
    whole, dropped = (stored_activations(ds, view(name, tp=1, seq_par=False, moe=True), ScalarOps, "moe")
                      for name in ("none", "moe_act"))
    moe_layer = block_layers(ds, one_gpu, ScalarOps, "moe").by_name("moe")[0]
    norm_outputs = sum(block_layers(ds, one_gpu, ScalarOps, "moe").module_dropped("layernorm"))
    assert whole.full - dropped.stored == pytest.approx(2 * tokens * 8 * 2048 + norm_outputs, rel=1e-12)
    assert norm_outputs == 2 * 2 * tokens * ds.model.hidden          # the QKV down projections' and the MoE's input
    assert moe_layer.stored_bytes > 2 * tokens * 8 * 2048
