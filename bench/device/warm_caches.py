"""Fill, once and in one process, the caches a fresh GPU machine starts without (section 0 of
bench/device/device_check.sh), so that no later section compiles inside its own time limit:

- Triton: every fused codec kernel the sections run (the fixed-rate specs of
  tests/unit/test_fixed_payloads.py and bench/device/device_codecs.py, encode and decode,
  fp32/fp16/bf16, a size divisible by 16 and one not: Triton specializes on that), written
  to TRITON_CACHE_DIR, which the later sections' processes (4 in section 6) read;
- torch's extension cache (TORCH_EXTENSIONS_DIR): the native decode attention that section
  8's CPU reference builds (~30 s);
- the .pyc files of the carried wheels (pip installs them with --no-compile): the first
  import writes them, so the 6 processes after this one do not each compile DeepSpeed.

    python bench/device/warm_caches.py [--device cuda|cpu]

`--device cpu` (the dry run) builds the extension and compiles the imports; no Triton.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the tests' lists

SIZES = (100_003, 1 << 16)  # not divisible by 16, and divisible


def triton_kernels(device) -> int:
    """Run every fixed-rate spec's encode and decode once per dtype and size class; returns
    the number of (spec, dtype, size) runs."""
    import torch
    from device_codecs import SPECS as SPEED_SPECS  # this script's folder

    from neoxlab.compress import make_compressor
    from tests.unit.test_fixed_payloads import DTYPES, FIXED

    runs = 0
    for spec in dict.fromkeys([*FIXED, *SPEED_SPECS]):
        c = make_compressor(spec)
        for dtype in DTYPES:
            for numel in SIZES:
                x = torch.randn(numel, device=device).to(dtype)
                c.decode_fixed(c.encode_fixed(x), numel, dtype)
                runs += 1
    torch.cuda.synchronize()
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    start = time.perf_counter()
    import torch

    from neoxlab.serve import native_attention

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    print(f"torch {torch.__version__} triton {triton_version} cuda "
          f"{torch.cuda.is_available()}", flush=True)

    if args.device != "cpu":
        t = time.perf_counter()
        runs = triton_kernels(torch.device(args.device))
        print(f"triton: {runs} codec runs (every spec x dtype x size class) compiled in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    t = time.perf_counter()
    built = native_attention.build()
    print(f"native decode attention: {'built' if built else 'not built'} in "
          f"{time.perf_counter() - t:.1f} s"
          + ("" if built else f" ({native_attention.unavailable()}; section 8 uses SDPA)"),
          flush=True)
    t = time.perf_counter()
    found = []
    for name in ("deepspeed", "megatron.core", "hydra", "omegaconf"):
        try:
            importlib.import_module(name)
            found.append(name)
        except ImportError:
            pass
    print(f"imports ({', '.join(found) or 'none carried'}) in {time.perf_counter() - t:.1f} s",
          flush=True)
    print(f"warm_caches: OK ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
