"""Hypothesis strategies for random valid models, systems and mappings."""

from __future__ import annotations

from hypothesis import strategies as st

from costmodel.inputs.mapping import Mapping, Recompute, ShardingStage, TPComm, TPOverlap
from costmodel.inputs.model import Model
from costmodel.inputs.step import WholeStep
from costmodel.inputs.system import AttentionFit, Compute, Datatype, GemmFit, Memory, Network, System


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def models(draw) -> Model:
    heads = draw(st.sampled_from([8, 12, 16, 32, 48]))
    head_size = draw(st.sampled_from([32, 64, 128]))
    hidden = heads * head_size
    # GPT-style (the defaults) or today's dense shapes: grouped-query or multi-query attention,
    # gated or squared-ReLU MLPs, RMSNorm, RoPE, untied embeddings, no biases
    kv_heads = draw(st.one_of(st.none(), st.sampled_from([d for d in divisors(heads) if d < heads])))
    mlp = draw(st.sampled_from(["gelu", "gelu", "swiglu", "geglu", "squared_relu"]))
    return Model(name="random", hidden=hidden, feedforward=(8 * hidden // 3 if mlp in ("swiglu", "geglu") else 4 * hidden),
                 attn_heads=heads, attn_size=head_size, kv_heads=kv_heads, mlp=mlp,
                 norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), position=draw(st.sampled_from(["learned", "rope"])),
                 tied_embeddings=draw(st.booleans()), bias=draw(st.booleans()),
                 seq_size=draw(st.sampled_from([512, 1024, 2048])), num_blocks=draw(st.sampled_from([4, 6, 12, 16, 24])),
                 vocab_size=draw(st.sampled_from([32000, 51200])))


@st.composite
def systems(draw, offload: bool | None = None) -> System:
    curve = [(0, draw(st.floats(0.2, 0.5))), (1e9, draw(st.floats(0.5, 0.7))), (1e11, draw(st.floats(0.7, 0.9)))]
    # Half the systems use the fitted shape-aware kernels (costmodel.terms.kernel_time) instead of the curve.
    fitted = draw(st.booleans())
    gemm = GemmFit(launch_us=draw(st.floats(0, 10)), efficiency=draw(st.floats(0.6, 0.95)),
                   depth_overhead=draw(st.floats(0, 500)), fill_outputs=draw(st.floats(0, 1e6)),
                   power_drop=draw(st.floats(0, 0.6)), power_flops=draw(st.floats(1e11, 1e13)),
                   hbm_efficiency=draw(st.floats(0.5, 0.9))) if fitted else None
    attention = AttentionFit(launch_us=draw(st.floats(0, 40)), tflops=draw(st.floats(500, 2000)),
                             head_size_overhead=draw(st.floats(0, 60)), seq_overhead=draw(st.floats(0, 800)),
                             fill_rows=draw(st.floats(0, 2e4))) if fitted and draw(st.booleans()) else None
    compute = Compute(matrix_tflops=draw(st.sampled_from([312.0, 989.0])), vector_tflops=60.0,
                      matrix_efficiency=None if fitted else curve, gemm=gemm, attention=attention,
                      vector_efficiency=[(0, 0.6)])
    has_offload = draw(st.booleans()) if offload is None else offload
    return System(
        name="random",
        compute={Datatype.float16: compute, Datatype.bfloat16: compute, Datatype.float8: compute},
        hbm=Memory(capacity_gib=draw(st.sampled_from([40.0, 80.0, 120.0])), bandwidth_gbps=2000.0,
                   efficiency=[(0, 0.6), (1e7, 0.85)], latency_us=draw(st.sampled_from([0.0, 5.0]))),
        offload=Memory(capacity_gib=512.0, bandwidth_gbps=draw(st.sampled_from([50.0, 100.0]))) if has_offload else None,
        networks=[Network(name="nvlink", size=draw(st.sampled_from([4, 8, 16])), bandwidth_gbps=300.0, efficiency=0.7,
                          latency_us=5.0, processor_usage=0.15),
                  Network(name="ib", size=4096, bandwidth_gbps=25.0, efficiency=0.8, latency_us=20.0,
                          processor_usage=0.05, port_per_gpu=draw(st.booleans()))],
        # whole-step terms (costmodel.terms.step_terms) on a third of the systems
        step=draw(st.sampled_from([None, None, WholeStep(kernel_gap_us=draw(st.floats(0, 20)),
                                                         power_window_ms=draw(st.floats(0, 20)),
                                                         allocator_fragmentation=draw(st.floats(0, 0.2)))])),
    )


@st.composite
def mappings(draw, model: Model, system: System, gpus: int | None = None) -> Mapping:
    """A mapping valid for the model and system (divisibility rules hold)."""
    tp = draw(st.sampled_from([t for t in divisors(model.kv_groups) if model.hidden % t == 0 and model.seq_size % t == 0
                               and model.feedforward % t == 0 and t <= 16]))
    pp = draw(st.sampled_from(divisors(model.num_blocks)))
    cp = draw(st.sampled_from([c for c in (1, 1, 2, 4) if model.seq_size % (2 * c) == 0 or c == 1]))
    dp = draw(st.sampled_from([1, 2, 4])) if gpus is None else None
    if gpus is not None:
        dp = max(1, gpus // (tp * cp * pp))
    local_batch = draw(st.sampled_from([1, 2, 4, 8, 16]))
    microbatch = draw(st.sampled_from([d for d in divisors(local_batch) if (d * model.seq_size) % (tp * cp) == 0]))
    interleaving = draw(st.sampled_from(divisors(model.num_blocks // pp))) if pp > 1 else 1
    recompute = draw(st.sampled_from(list(Recompute)))
    offload = system.offload is not None
    nets = len(system.networks)
    return Mapping(
        num_procs=tp * cp * pp * dp, tensor_par=tp, context_par=cp, pipeline_par=pp, data_par=dp,
        tensor_par_net=draw(st.integers(0, nets - 1)), context_par_net=draw(st.integers(0, nets - 1)),
        pipeline_par_net=draw(st.integers(0, nets - 1)),
        data_par_net=draw(st.integers(0, nets - 1)), batch_size=local_batch * dp, microbatch_size=microbatch,
        datatype=draw(st.sampled_from([Datatype.float16, Datatype.float8])), fused_attention=draw(st.booleans()),
        activation_recompute=recompute, pipeline_interleaving=interleaving,
        sharding_stage=draw(st.sampled_from(list(ShardingStage))), tensor_par_comm_type=draw(st.sampled_from(list(TPComm))),
        tensor_par_overlap=draw(st.sampled_from(list(TPOverlap))), seq_par_ag_redo=draw(st.booleans()),
        # (with cp 1 there is no context-parallel group: a file states p2p, the default)
        context_par_comm=draw(st.sampled_from(["p2p", "all_gather"])) if cp > 1 else "p2p",
        data_par_overlap=draw(st.booleans()), pipeline_schedule=draw(st.sampled_from(["1f1b", "zb-h1"])),
        grad_datatype=draw(st.sampled_from(["float32", "16bit"])),
        cuda_graphs=draw(st.sampled_from(["none", "per-layer", "full-iteration"])),
        fused_cross_entropy=draw(st.booleans()), fused_activation=draw(st.booleans()),
        weight_offload=offload and draw(st.booleans()), activations_offload=offload and draw(st.booleans()),
        optimizer_offload=offload and draw(st.booleans()),
    )
