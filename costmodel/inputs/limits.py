"""What is physically meaningful: the bounds every input is checked against, at the input
boundary (the model, system and batch files, and the command line), each with its reason.

They are generous — orders of magnitude beyond any machine or model built — and they
keep every number the solver derives in range: CP-SAT takes 64-bit integers (products of
sizes, times quantized to millionths of the fastest mapping's compute, memory in MiB) and
its parameters are 32-bit. A value outside a bound is refused with the bound and its
reason, never deep inside the solver.
"""

from __future__ import annotations

from dataclasses import dataclass

INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class Bound:
    """Inclusive range [low, high] of one input, and why it stops there."""

    low: float
    high: float
    reason: str

    def problem(self, value: float) -> str | None:
        """Why `value` is out of range, or None when it is inside."""
        if value < self.low:
            return f"below {shown(self.low)}, the smallest mapsat accepts ({self.reason})"
        if value > self.high:
            return f"above {shown(self.high)}, the largest mapsat accepts ({self.reason})"
        return None


def shown(value: float) -> str:
    """2^k for large powers of two, 2^63 - 1 for the int64 limit, whole numbers with commas."""
    if value == INT64_MAX:
        return "2^63 - 1"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        whole = int(value)
        if whole >= 1 << 20 and whole & (whole - 1) == 0:
            return f"2^{whole.bit_length() - 1}"
        return f"{whole:,}"
    return f"{value:g}"


# ---- the model (costmodel.inputs.model.Model)
HIDDEN = Bound(1, 1 << 20, "the widest models built are 2^14-2^15 wide")
FEEDFORWARD = Bound(1, 1 << 22, "4 × the widest hidden size")
SEQ_SIZE = Bound(1, 1 << 24, "16M tokens, far past the longest trained context")
ATTN_HEADS = Bound(1, 1 << 16, "a head per 16 columns of the widest hidden size")
ATTN_SIZE = Bound(1, 1 << 16, "a head as wide as the widest hidden size")
NUM_BLOCKS = Bound(1, 1 << 20, "the deepest models built have a few hundred blocks")
NUM_BLOCKS_OR_NONE = Bound(0, 1 << 20, "0 (none) up to the deepest model's blocks")
VOCAB_SIZE = Bound(1, 1 << 24, "16M tokens, 60 × the largest vocabularies in use")
NUM_EXPERTS = Bound(0, 1 << 16, "0 is a dense model; the most routed experts built are 256 (DeepSeek-V3) and 512 "
                                "(Qwen3-Next)")
EXPERTS_PER_TOKEN = Bound(0, 1 << 16, "top-k routing picks at most every expert; models route 1-8 per token")
EXPERT_FEEDFORWARD = Bound(0, 1 << 22, "as feed-forward: 4 × the widest hidden size (0 for a dense model)")
SHARED_EXPERTS = Bound(0, 1 << 10, "always-active experts; models have 0-4 (DeepSeek-V3 1, Qwen1.5-MoE 4 fused into one)")
MOE_EVERY = Bound(1, 1 << 20, "every k-th block is a mixture-of-experts block, as the deepest models have blocks")
CAPACITY_FACTOR = Bound(1.0, 1024.0, "the busiest expert's tokens over the mean: 1 is perfect balance, and below 1 "
                                     "tokens would be dropped (not modelled)")

# ---- the system (costmodel.inputs.system.System)
TFLOPS = Bound(1e-3, 1e6, "1 GFLOP/s to 1 EFLOP/s per GPU; an H100 does 989 TFLOP/s in bf16")
CAPACITY_GIB = Bound(2.0**-10, 2.0**16, "1 MiB (the solver's memory unit) to 64 TiB per GPU")
CAPACITY_GIB_OR_ZERO = Bound(0.0, 2.0**16, "none up to 64 TiB per GPU")
HEADROOM_PERCENT = Bound(0.0, 99.0, "a percentage of HBM kept free; 100 % would leave nothing")
BANDWIDTH_GBPS = Bound(1e-3, 1e6, "1 MB/s to 1 PB/s per GPU; HBM3 does 3,350 GB/s")
EFFICIENCY = Bound(1e-3, 1.0, "a fraction of peak; below 0.1 % the hardware is not working")
LATENCY_US = Bound(0.0, 1e6, "up to one second per collective; real ones take microseconds")
NETWORK_SIZE = Bound(1, INT64_MAX, "a GPU count is a 64-bit integer; any size >= the GPU count behaves the same")
BYTES_FACTOR = Bound(1e-3, 1024.0, "bytes moved per participant per message byte: a ring all-reduce moves 2")
N_OFFSET = Bound(-2.0, 0.0, "n + n_offset must stay >= 0 for every group of n >= 2 GPUs, or a collective "
                            "would move negative bytes; a ring uses -1")
NETWORK_INDEX = Bound(0, 1023, "an index into the system's networks; systems have two or three")
NETWORKS = Bound(1, 16, "network levels; real systems have two or three (NVLink, InfiniBand)")
CURVE_POINTS = Bound(1, 1024, "[size, efficiency] pairs in one curve; calibrated curves have a handful")
SHAPE_OVERHEAD = Bound(0.0, 1e30, "a fitted kernel-time shape term (costmodel.terms.kernel_time); 1e30 is past any "
                                   "operation")
FRACTION = Bound(0.0, 1.0, "a share of a quantity, from none to all of it")
COMPUTE_CAPABILITY = Bound(1.0, 100.0, "a CUDA compute capability: 8.0 (A100) to 10.3 (B300)")
CLOCK_MHZ = Bound(1.0, 1e5, "an SM clock in MHz; GPUs run at 1,000-2,200 MHz")
POWER_W = Bound(1.0, 1e5, "a GPU's power cap in W; GPUs are capped at 250-1,400 W")
POWER_WINDOW_MS = Bound(0.0, 1e5, "up to 100 s; power limiters act within milliseconds")
CURVE_SIZE = Bound(0.0, 1e30, "an operation's FLOP or bytes; 1e30 is past any model")

# ---- the search (command line and batch files)
GPUS_COUNT = Bound(1, INT64_MAX, "a 64-bit integer; counting is closed-form at any size")
GPUS_SEARCH = Bound(1, 1 << 24, "16.7M GPUs, 100 × the largest clusters; solve and brute score mappings")
MAX_BATCH_COUNT = Bound(1, INT64_MAX, "a 64-bit integer")
MAX_BATCH_SEARCH = Bound(1, 1 << 24, "16.7M sequences per step, 1000 × the largest batches trained")
TIME_LIMIT_S = Bound(1e-6, 1e6, "a microsecond to eleven days")
WORKERS = Bound(1, 1024, "threads or processes; more than the cores only slows the search")
SEED = Bound(-(1 << 31), (1 << 31) - 1, "CP-SAT's random seed is a 32-bit integer")
JOBS = Bound(1, 1024, "processes at once; each needs memory of its own")
PARAMS = Bound(1, 1e18, "a quintillion parameters, 10^5 × the largest models built")
TOP_K = Bound(1, 1000, "mappings listed; a longer table is not read")
