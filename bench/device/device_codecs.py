"""Fixed-size codec throughput on one device, as a ratio to a device-to-device copy.

    python bench/device/device_codecs.py [--device cuda] [--mib 64] [--repeats 10]

For each fixed-rate codec: GB/s of input (10^9 bytes) for encode_fixed and decode_fixed of
one fp32 tensor of --mib MiB (captured-like data: Gaussian noise scaled per 4 KiB row, as
gradients are), next to ``dst.copy_(src)`` of the same tensor timed in the same rounds;
median of --repeats after a warm-up, timed with device events. The kernels are whatever
NEOXLAB_CODEC_KERNELS selects (auto: Triton on CUDA); zfp also gets a row with the
torch-ops path, and every int8/int4/zfp spec a row with the NVRTC kernels (compress/
nvrtc_codecs.cu; on --device cpu their host build), after nvrtc_identity.py has checked
their bytes against the torch reference (a mismatch fails the run). Goals on a GPU:
casts >= 0.8x copy, int8/int4 >= 0.5x, ZFP >= 0.25x. ``--device cpu`` is a dry run of the
script itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from neoxlab.compress import make_compressor

try:  # a sibling script (bench/device/ is on sys.path when this runs as a script)
    import nvrtc_identity
except ImportError:  # imported as bench.device.device_codecs
    from bench.device import nvrtc_identity

SPECS = ["none", "fp16", "bf16", "int8", "int4", "zfp:rate=8", "zfp:rate=16", "zfp:rate=4"]
GOALS = {"fp16": 0.8, "bf16": 0.8, "int8": 0.5, "int4": 0.5, "zfp": 0.25}


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    if device.type == "cuda":
        def run(fn: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def run(fn: Callable[[], object]) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return run


def median_times(fns: list[Callable[[], object]], repeats: int, run) -> list[float]:
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats + 1):  # round 0 warms up (Triton compiles, tables upload)
        for fn, ts in zip(fns, times, strict=True):
            t = run(fn)
            if r:
                ts.append(t)
    return [statistics.median(ts) for ts in times]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mib", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--specs", nargs="*", default=SPECS)
    ap.add_argument("--fail-short", action="store_true",
                    help="exit 1 when a codec is short of its speed goal")
    args = ap.parse_args()
    dev = torch.device(args.device)
    run = timer(dev)
    n = int(args.mib * 2**20) // 4
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(n, generator=g) * torch.rand(n // 1024 + 1, generator=g)
         .repeat_interleave(1024)[:n]).to(dev)
    gb = x.nbytes / 1e9
    dst = torch.empty_like(x)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"# {x.nbytes / 2**20:.0f} MiB fp32 on {name}; torch {torch.__version__}; kernels "
          f"{os.environ.get('NEOXLAB_CODEC_KERNELS', 'auto')}; median of {args.repeats}")
    print(f"{'codec':<26}{'enc GB/s':>10}{'dec GB/s':>10}{'copy GB/s':>11}{'enc/copy':>10}"
          f"{'dec/copy':>10}{'ratio':>7}  goal")
    short = 0
    rows = [(s, None) for s in args.specs]
    rows += [(s, "torch") for s in args.specs if s.startswith("zfp:rate=8")]
    # -- the NVRTC codecs: bit-identity first, then a row per fused codec --------------
    mismatches = nvrtc_identity.check(dev)
    for m in mismatches:
        print(f"NVRTC MISMATCH {m}")
    print(f"# nvrtc bit-identity against the torch reference: "
          f"{'OK' if not mismatches else 'FAILED'} ({len(nvrtc_identity.CASES)} cases)")
    rows += [(s, "nvrtc") for s in args.specs if s.split(":")[0] in ("int8", "int4", "zfp")]
    for spec, kernels in rows:
        before = os.environ.get("NEOXLAB_CODEC_KERNELS")
        if kernels:
            os.environ["NEOXLAB_CODEC_KERNELS"] = kernels
        try:
            c = make_compressor(spec)
            payload = c.encode_fixed(x)
            out = torch.empty_like(x)
            t_cp, t_enc, t_dec = median_times(
                [lambda: dst.copy_(x), lambda c=c, p=payload: c.encode_fixed(x, out=p),
                 lambda c=c, p=payload, o=out: c.decode_fixed(p, n, x.dtype, out=o)],
                args.repeats, run)
        finally:
            if kernels:
                if before is None:
                    os.environ.pop("NEOXLAB_CODEC_KERNELS")
                else:
                    os.environ["NEOXLAB_CODEC_KERNELS"] = before
        enc, dec, cp = gb / t_enc, gb / t_dec, gb / t_cp
        goal = GOALS.get(c.name)
        verdict = "-"
        if goal is not None and not kernels:
            ok = min(enc, dec) / cp >= goal
            short += not ok
            verdict = f">={goal:g}x {'PASS' if ok else 'SHORT'}"
        label = c.describe() + (f" [{kernels}]" if kernels else "")
        print(f"{label:<26}{enc:>10.1f}{dec:>10.1f}{cp:>11.1f}{enc / cp:>10.3f}"
              f"{dec / cp:>10.3f}{x.nbytes / payload.numel():>7.2f}  {verdict}")
    print(f"# rows short of their goal: {short}")
    return 1 if (short and args.fail_short) or mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
