"""DeepSeek-V3's H800 training trace as read into problems/measurements/deepseek-v3-h800-trace,
and the MoE layer's named element-wise parts the trace check (benchmarks/bench_moe_trace.py) reads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from costmodel.terms.context import Context
from costmodel.inputs.load import load_model, load_system
from costmodel.ops import ScalarOps
from costmodel.inputs.system import Datatype
from costmodel.terms.moe import moe_layer_forward

ROOT = Path(__file__).resolve().parents[1]
READING = json.loads((ROOT / "problems/measurements/deepseek-v3-h800-trace/layer.json").read_text())


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kernel, expected", [
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::m_grouped_fp8_ptp128c::GemmKernel>", "grouped_gemm"),
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>", "wgrad_gemm"),
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>", "dense_gemm"),
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>", "communication"),
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>", "permute"),
    ("void cuda::swiglu_forward_with_weight_and_per_token_cast_to_fp8_with_channels_impl<__nv_bfloat16, true>",
     "quantize"),
    ("void cuda::swiglu_backward<__nv_bfloat16>", "activation"),
    ("void cuda::per_channel_cast_and_transpose<256, 128, true, true, true, false, true>", "quantize"),
    ("void layer_norm::ln_bwd_kernel<layer_norm::Kernel_traits<__nv_bfloat16>>", "norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "other_eltwise"),
])
def test_trace_kernel_categories(kernel, expected):
    assert _module("read_deepseek_trace").category(kernel) == expected


def test_trace_reading_agrees_with_the_first_reading():
    """Per token and layer (ns), the shared first reading (validation/public-kernels/
    deepseek-v3-h800-layer.csv, made independently): casts 1023, permute 334, RMSNorm 210, SwiGLU
    114, RoPE 92; within 10 %. Its GEMM and attention rows sum to this reading's to 2 µs."""
    tokens = READING["tokens_per_microbatch"]
    assert tokens == 4096
    per_token_ns = {label: 1e3 * us / tokens for label, us in READING["us_per_layer"].items()}
    for label, ns in {"quantize": 1023, "permute": 334, "norm": 210, "activation": 114, "rope": 92}.items():
        assert per_token_ns[label] == pytest.approx(ns, rel=0.10), label
    us = READING["us_per_layer"]
    assert us["grouped_gemm"] == pytest.approx(2898 + 2834, abs=2)
    assert us["wgrad_gemm"] == pytest.approx(8189, abs=2)
    assert us["attention"] == pytest.approx(1237 + 4254, abs=2)
    assert READING["compute_us_per_layer"] == pytest.approx(
        sum(v for label, v in us.items() if label != "communication"), abs=0.5)


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_moe_layer_named_eltwise_parts_add_up(dispatcher):
    """The named parts of an MoE layer's element-wise time are the whole of it."""
    from costmodel.inputs.kernels import Kernels
    model = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=4096)
    system = load_system(ROOT / "problems/systems/h800-80g-nvl8.yaml")
    c = Context.build(model, system, Datatype.bfloat16, Kernels(moe_dispatcher=dispatcher))
    layer = moe_layer_forward(c, ScalarOps, 4096.0, 1.0, 64.0, 1.0)
    parts = (layer.router_eltwise_s + layer.permute_s + layer.expert_activation_s + layer.shared_activation_s
             + layer.launches_s)
    assert layer.permute_s > 0 and layer.router_eltwise_s > 0 and layer.launches_s > 0
    assert parts == pytest.approx(layer.eltwise_s, rel=1e-12)


def test_trace_check_runs():
    """The check prints a row per category; every model figure is positive."""
    bench = _module("bench_moe_trace")
    trace = READING
    model = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=trace["tokens_per_microbatch"])
    system = load_system(ROOT / "problems/systems/h800-80g-nvl8.yaml")
    mapping = bench.trace_mapping(trace["tokens_per_microbatch"]).with_model_defaults(True)
    from costmodel.evaluate import _scalar_fields
    c = Context.build(model, system, mapping.datatype, mapping.kernels)
    predicted = bench.model_categories(c, _scalar_fields(mapping), ScalarOps)
    assert set(predicted) == set(bench.TRACE_CATEGORIES)
    assert all(seconds > 0 for seconds in predicted.values())


def test_busy_time_counts_overlapping_kernels_once():
    """Two kernels at once on two streams occupy the union of their intervals, not the sum."""
    busy_us = _module("read_deepseek_trace").busy_us
    assert busy_us([(0.0, 10.0), (5.0, 12.0), (20.0, 21.0), (20.5, 20.7)]) == pytest.approx(13.0)
    assert busy_us([]) == 0.0


def test_trace_reading_records_the_sms_its_gemms_held():
    """The trace's DeepSeek GEMMs are persistent grids of 112 thread blocks on 132-SM H800s
    (DualPipe's 20 SMs for communication, DeepSeek-V3 report §3.2.2); the weight-gradient GEMMs
    overlap on two streams, so their busy time is below their summed durations."""
    assert (READING["gemm_thread_blocks"], READING["device_sms"]) == (112, 132)
    busy, summed = READING["busy_us_per_layer"], READING["us_per_layer"]
    assert busy["wgrad_gemm"] < summed["wgrad_gemm"]
    assert all(busy[label] == pytest.approx(summed[label]) for label in summed if label != "wgrad_gemm")
    assert READING["compute_busy_us_per_layer"] < READING["compute_us_per_layer"]


def test_only_compute_bound_categories_move_to_the_trace_sms():
    bench = _module("bench_moe_trace")
    scaled = bench.at_trace_sms({"dense_gemm": 1.0, "attention": 2.0, "quantize": 3.0}, READING)
    assert scaled == pytest.approx({"dense_gemm": 132 / 112, "attention": 2 * 132 / 112, "quantize": 3.0})
