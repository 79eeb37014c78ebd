"""Benchmark: the B200's grouped GEMMs as the cost model times them, beside what a published
MoE-layer measurement implies.

    python benchmarks/bench_moe_layer_b200.py

The measurement is problems/measurements/b200-torchao-moe/layer.json (pytorch/ao's MoE training
README: one torchtitan MoE layer, forward + backward, on a B200: 131,072 tokens, 8 local experts
and a shared one, top-1, in BF16 and with the routed experts' GEMMs in MXFP8; and the MXFP8
kernels of one of its three routed GEMMs, timed one by one). The B200 file's BF16 grouped GEMMs
are fitted on another table of that README (torch._grouped_mm forward + backward,
problems/measurements/b200-xla/grouped_gemm_fwd_bwd.json); nothing is fitted on this one: it is a
second reading of the same kernels, by another route and a later torch.

What the layer pair implies (a reading, not a measurement): the two runs differ only in the
routed experts' GEMMs, so the BF16 routed GEMMs take

    BF16 layer − MXFP8 layer + the MXFP8 routed GEMMs with their quantisation kernels,

the last being 3 × (forward + activation gradient + weight gradient + the quantise and
scale-layout kernels) of the breakdown's GEMM (the layer's three routed GEMMs have one shape
and its transpose). Printed beside the model's time of the same GEMMs (three grouped GEMMs of 8
experts × 16,384 rows, forward, each pass timed as forward's, the model's rule) on
problems/systems/b200-180g-nvl8.yaml, and for scale the model's BF16 GEMMs of the whole layer
(routed and shared) against the measured BF16 layer. Then the breakdown's three MXFP8 grouped
GEMMs one by one beside the model's FP8 grouped GEMMs (the FP8 GEMM fit with batch = experts: no
FP8 grouped GEMM is fitted). Asserts nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.system import Datatype
from costmodel.ops import ScalarOps
from costmodel.terms.context import Context
from costmodel.terms.layer_time import matmul_s
from costmodel.terms.moe import grouped_gemm_s

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "problems/measurements/b200-torchao-moe/layer.json"
PASSES = 3
"""forward, activation gradient, weight gradient"""


def context(datatype: Datatype = Datatype.bfloat16) -> Context:
    """`datatype` on the B200 file (the model file only gives the context its shape; the GEMMs
    below take their shapes from the measurement)."""
    model = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=8192)
    mapping = Mapping(num_procs=8, tensor_par=1, pipeline_par=1, data_par=8, batch_size=8, microbatch_size=1,
                      datatype=datatype.value)
    return Context.build(model, load_system(ROOT / "problems/systems/b200-180g-nvl8.yaml"), datatype,
                         mapping.kernels)


def model_layer_gemms_s(c: Context, layer: dict) -> tuple[float, float]:
    """(routed, shared) BF16 GEMM seconds of one layer, forward + backward: the routed experts as
    grouped GEMMs (gate and up side by side, then down), the shared expert as plain GEMMs."""
    tokens, h, f, experts = layer["tokens"], layer["dim"], layer["hidden_dim"], layer["local_experts"]
    rows = tokens / experts                        # (top-1, balanced)
    routed = grouped_gemm_s(c, ScalarOps, experts, rows, 2 * f, h) + grouped_gemm_s(c, ScalarOps, experts, rows, h, f)
    shared = matmul_s(c, ScalarOps, tokens, 2 * f, h) + matmul_s(c, ScalarOps, tokens, h, f)
    return PASSES * routed, PASSES * shared


def implied_bf16_routed_s(measured: dict, layer: dict) -> float:
    """The BF16 routed GEMMs' seconds the layer pair implies (module docstring)."""
    breakdown = measured["mxfp8_breakdown_us"]
    one_gemm_us = sum(breakdown["gemms"].values()) + sum(breakdown["quantize_and_scale_layout"].values())
    return (layer["bf16_ms"] - layer["mxfp8_ms"]) * 1e-3 + PASSES * one_gemm_us * 1e-6


def main() -> int:
    measured = json.loads(MEASURED.read_text())
    c = context()
    print(f"B200 BF16 MoE layer, forward + backward ({measured['source'].split(':')[0]})")
    for layer in measured["layers"]:
        routed, shared = model_layer_gemms_s(c, layer)
        flops = PASSES * 2 * layer["tokens"] * layer["dim"] * layer["hidden_dim"] * 3
        print(f"  {layer['model']}: measured layer {layer['bf16_ms']:.1f} ms BF16, {layer['mxfp8_ms']:.1f} ms MXFP8; "
              f"model's GEMMs {1e3 * (routed + shared):.1f} ms (routed {1e3 * routed:.1f}, shared {1e3 * shared:.1f}; "
              f"{flops / routed / 1e12:,.0f} TFLOP/s routed)")
        if layer["dim"] * layer["hidden_dim"] == 7168 * 2048:       # (the breakdown's shape)
            implied = implied_bf16_routed_s(measured, layer)
            print(f"    routed BF16 GEMMs implied by the pair: {1e3 * implied:.1f} ms "
                  f"({flops / implied / 1e12:,.0f} TFLOP/s); model/implied {routed / implied:.2f}")
    print_mxfp8_gemms(measured)
    return 0


def print_mxfp8_gemms(measured: dict) -> None:
    """The breakdown's MXFP8 grouped GEMMs, (131072 rows over 8 experts) × 7168 × 2048, as they ran
    (forward, activation gradient, weight gradient) beside the model's FP8 grouped GEMMs."""
    c, experts, tokens, h, f = context(Datatype.float8), 8, 131072, 7168, 2048
    rows = tokens / experts
    shapes = {"forward": (rows, f, h), "activation_gradient": (rows, h, f), "weight_gradient": (h, f, rows)}
    print("  MXFP8 grouped GEMMs of the breakdown (measured, one by one) against the model's FP8 grouped GEMMs:")
    for name, measured_us in measured["mxfp8_breakdown_us"]["gemms"].items():
        modelled_us = 1e6 * grouped_gemm_s(c, ScalarOps, experts, *shapes[name])
        print(f"    {name}: measured {measured_us:,.0f} µs, model {modelled_us:,.0f} µs "
              f"(model/measured {modelled_us / measured_us:.2f})")


if __name__ == "__main__":
    raise SystemExit(main())
