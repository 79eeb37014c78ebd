"""Unit conversions at the input/output boundary. Inside, everything is SI: seconds, bytes,
FLOP, bytes per second. Decimal prefixes for rates (GB/s, TFLOP/s), binary for capacities
(GiB), as vendors quote them."""

GiB = 2**30
MiB = 2**20
GB = 1e9
TERA = 1e12
MICRO = 1e-6
MILLI = 1e-3


def gib_to_bytes(gib: float) -> float:
    return gib * GiB


def bytes_to_gib(num_bytes: float) -> float:
    return num_bytes / GiB


def gbps_to_bytes_per_s(gbps: float) -> float:
    """GB/s (decimal, 1e9 bytes per second) to bytes per second."""
    return gbps * GB


def tflops_to_flops_per_s(tflops: float) -> float:
    return tflops * TERA
