"""GPU microbenchmarks for calibrating mapsat's cost model (one GPU, PyTorch): writes the
JSON files `mapsat calibrate` reads (format: problems/measurements/README.md).

    pip install -e '.[measure]'          # torch (with triton)
    python benchmarks/measure_gpu.py OUTDIR [sections...]
    mapsat calibrate --base BASE.yaml --measurements OUTDIR --out SYSTEM.yaml

Adapted from the project's shared validation script `validation/gpu-microbench/measure.py`
(2026-11-22), which measured problems/measurements/; the measuring code is unchanged, so new
measurements are comparable with the shipped ones. Needs a CUDA GPU; not run in CI.

Sections (each independent; a failure in one is recorded and the rest go on):
  env        GPU, driver, torch versions, clocks
  gemm       matrix-multiply time over a grid of (M, N, K) and over transformer-block shapes,
             bf16 (torch.matmul) and fp8 e4m3 (torch._scaled_mm, bf16 out)
  attention  fused attention (SDPA, flash backend) forward and forward+backward, causal
  eltwise    HBM-bound layers (copy, add, gelu, dropout, layer norm, softmax) by size
  host       pinned host <-> device copies by size: H2D, D2H, both at once
  adam       fused AdamW step on fp32 master weights, by parameter count
  overlap    a large GEMM with pinned host copies running beside it (offload interference)
Usage: python benchmarks/measure_gpu.py OUTDIR [sections...]
"""
import json, math, os, sys, time, traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SECTIONS = sys.argv[2:] or ["env", "gemm", "attention", "eltwise", "host", "adam", "overlap"]
dev = torch.device("cuda")
results = {}


def bench(fn, rep_ms=25, warm_ms=5):
    """Median ms with L2 flushed between runs (triton's do_bench)."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warm_ms, rep=rep_ms, return_mode="median")


def save(name):
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(results[name], f)


def section_env():
    import subprocess
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,clocks.max.mem",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    p = torch.cuda.get_device_properties(0)
    results["env"] = dict(nvidia_smi=smi, torch=torch.__version__, cuda=torch.version.cuda,
                          name=p.name, sms=p.multi_processor_count, mem_bytes=p.total_memory,
                          date=time.strftime("%Y-%m-%d"))
    print("env:", results["env"])


def time_gemm(M, N, K, dtype):
    if dtype == "bf16":
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        fn = lambda: torch.matmul(a, b)
    else:
        a = torch.randn(M, K, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    fn(); torch.cuda.synchronize()
    flops = 2.0 * M * N * K
    rep = 25 if flops < 2e12 else 60
    ms = bench(fn, rep_ms=rep)
    del a, b
    return ms


def section_gemm():
    pts = []
    sizes = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    grid = [(M, N, K) for M in sizes for N in sizes for K in sizes if 2.0 * M * N * K <= 2 ** 42]
    # Transformer-block GEMMs (forward, dgrad, wgrad) for hidden h, tp t, tokens T.
    blocks = set()
    for h in (4096, 8192, 12288, 18432, 25600):
        for t in (1, 2, 4, 8, 16):
            for T in (2048, 8192):
                for (k, n) in ((h, 3 * h // t), (h // t, h), (h, 4 * h // t), (4 * h // t, h)):
                    blocks.add((T, n, k)); blocks.add((T, k, n)); blocks.add((k, n, T))
    blocks = sorted(blocks)
    t0 = time.time()
    for dtype in ("bf16", "fp8"):
        for kind, shapes in (("grid", grid), ("block", blocks)):
            for (M, N, K) in shapes:
                if dtype == "fp8" and (M % 16 or N % 16 or K % 16):
                    continue
                try:
                    ms = time_gemm(M, N, K, dtype)
                    pts.append(dict(dtype=dtype, kind=kind, M=M, N=N, K=K, ms=ms,
                                    tflops=2.0 * M * N * K / ms / 1e9))
                except Exception as e:  # noqa: BLE001
                    pts.append(dict(dtype=dtype, kind=kind, M=M, N=N, K=K, error=str(e)[:200]))
            print(f"gemm {dtype} {kind}: {len(shapes)} shapes, {time.time() - t0:.0f} s", flush=True)
            torch.cuda.empty_cache()
    results["gemm"] = pts


def section_attention():
    pts = []
    for seq in (2048, 4096, 8192):
        for d in (64, 72, 128):
            for heads in (4, 8, 16, 32, 64):
                for b in (1, 2, 4):
                    if b * heads * seq > 8 * 64 * 8192:
                        continue
                    try:
                        q, k, v = (torch.randn(b, heads, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                                   for _ in range(3))
                        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        o = fwd(); g = torch.randn_like(o)
                        def fb():
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                            out.backward(g)
                        fb(); torch.cuda.synchronize()
                        ms_f = bench(fwd); ms_fb = bench(fb)
                        # causal: half of the 4·b·a·s²·d forward matrix FLOP are needed
                        f_flops = 4.0 * b * heads * seq * seq * d / 2
                        pts.append(dict(seq=seq, head_dim=d, heads=heads, batch=b, fwd_ms=ms_f, fwd_bwd_ms=ms_fb,
                                        fwd_tflops_causal=f_flops / ms_f / 1e9,
                                        fwd_bwd_tflops_causal=3.5 * f_flops / ms_fb / 1e9))
                        del q, k, v, o, g
                    except Exception as e:  # noqa: BLE001
                        pts.append(dict(seq=seq, head_dim=d, heads=heads, batch=b, error=str(e)[:200]))
    torch.cuda.empty_cache()
    results["attention"] = pts
    print(f"attention: {len(pts)} points", flush=True)


def section_eltwise():
    pts = []
    for mib in (1, 4, 16, 64, 256, 1024):
        n = mib * 2 ** 20 // 2  # bf16 elements
        h = 4096
        rows = max(n // h, 1)
        x = torch.randn(rows, h, device=dev, dtype=torch.bfloat16)
        y = torch.randn_like(x)
        ln = nn.LayerNorm(h, device=dev, dtype=torch.bfloat16)
        ops = {
            "copy": (lambda: x.clone(), 2),
            "add": (lambda: x + y, 3),
            "gelu": (lambda: F.gelu(x, approximate="tanh"), 2),
            "dropout": (lambda: F.dropout(x, 0.1, training=True), 2),  # + 1-byte mask not counted
            "layernorm": (lambda: ln(x), 2),
            "softmax": (lambda: torch.softmax(x, dim=-1), 2),
        }
        for name, (fn, passes) in ops.items():
            with torch.no_grad():
                ms = bench(fn)
            byts = passes * x.numel() * 2
            pts.append(dict(op=name, mib=mib, ms=ms, bytes=byts, gbps=byts / ms / 1e6))
        del x, y
    torch.cuda.empty_cache()
    results["eltwise"] = pts
    print(f"eltwise: {len(pts)} points", flush=True)


def section_host():
    pts = []
    for mib in (1, 8, 64, 256, 1024):
        n = mib * 2 ** 20
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        h2 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        d = torch.empty(n, dtype=torch.uint8, device=dev)
        d2 = torch.empty(n, dtype=torch.uint8, device=dev)
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        def timed(fn, reps):
            fn(); torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / reps * 1e3
        reps = max(3, min(200, 2048 // mib))
        h2d = timed(lambda: d.copy_(h, non_blocking=True), reps)
        d2h = timed(lambda: h.copy_(d, non_blocking=True), reps)
        def both():
            with torch.cuda.stream(s1):
                d.copy_(h, non_blocking=True)
            with torch.cuda.stream(s2):
                h2.copy_(d2, non_blocking=True)
        bi = timed(both, reps)
        pts.append(dict(mib=mib, h2d_gbps=n / h2d / 1e6, d2h_gbps=n / d2h / 1e6, bidir_each_gbps=n / bi / 1e6))
        del h, h2, d, d2
    results["host"] = pts
    print("host:", pts, flush=True)


def section_adam():
    pts = []
    for mparams in (10, 100, 500, 1000):
        n = mparams * 10 ** 6
        p = torch.zeros(n, device=dev, dtype=torch.float32).normal_()
        p = nn.Parameter(p)
        p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
        opt.step(); torch.cuda.synchronize()
        ms = bench(lambda: opt.step(), rep_ms=50)
        # reads p, g, m, v and writes p, m, v: 7 × 4 bytes per parameter
        pts.append(dict(params=n, ms=ms, ns_per_param=ms * 1e6 / n, gbps_28B=28 * n / ms / 1e6))
        del p, opt
        torch.cuda.empty_cache()
    results["adam"] = pts
    print("adam:", pts, flush=True)


def section_overlap():
    """Does streaming to and from pinned host memory (offload traffic) slow a GEMM, and vice versa?"""
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16); b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    mib = 256
    h1 = torch.empty(mib * 2 ** 20, dtype=torch.uint8, pin_memory=True)
    h2 = torch.empty(mib * 2 ** 20, dtype=torch.uint8, pin_memory=True)
    d1 = torch.empty(mib * 2 ** 20, dtype=torch.uint8, device=dev)
    d2 = torch.empty(mib * 2 ** 20, dtype=torch.uint8, device=dev)
    s_cmp, s_in, s_out = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    def run(gemms, copies):
        torch.cuda.synchronize()
        e = [torch.cuda.Event(enable_timing=True) for _ in range(6)]
        with torch.cuda.stream(s_cmp):
            e[0].record()
            for _ in range(gemms):
                torch.matmul(a, b)
            e[1].record()
        with torch.cuda.stream(s_in):
            e[2].record()
            for _ in range(copies):
                d1.copy_(h1, non_blocking=True)
            e[3].record()
        with torch.cuda.stream(s_out):
            e[4].record()
            for _ in range(copies):
                h2.copy_(d2, non_blocking=True)
            e[5].record()
        torch.cuda.synchronize()
        g = e[0].elapsed_time(e[1]) / 1e3; i = e[2].elapsed_time(e[3]) / 1e3; o = e[4].elapsed_time(e[5]) / 1e3
        return (2.0 * n ** 3 * gemms / g / 1e12 if gemms else None,
                mib * 2 ** 20 * copies / i / 1e9 if copies else None, mib * 2 ** 20 * copies / o / 1e9 if copies else None)
    run(20, 2)
    alone_gemm = run(200, 0)[0]
    alone_copy = run(0, 40)[1:]
    both = run(200, 40)
    results["overlap"] = dict(gemm_tflops_alone=alone_gemm, h2d_d2h_gbps_alone=alone_copy,
                              gemm_tflops_with_copies=both[0], h2d_d2h_gbps_with_gemm=both[1:],
                              note="8192^3 bf16 GEMMs on one stream; 256 MiB pinned H2D and D2H copies on two others")
    print("overlap:", results["overlap"], flush=True)


for sec in SECTIONS:
    t = time.time()
    try:
        globals()[f"section_{sec}"]()
    except Exception:  # noqa: BLE001
        results[sec] = dict(error=traceback.format_exc()[-2000:])
        print(f"{sec} FAILED:\n{results[sec]['error']}", flush=True)
    save(sec)
    print(f"== {sec} done in {time.time() - t:.0f} s", flush=True)
