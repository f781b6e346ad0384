"""The NVRTC codecs (compress/nvrtc_codecs.cu) on a device against the torch reference on
the CPU: the same bytes and values, at every spec and dtype the Triton tests use and ZFP at
every rate. On a GPU that is the compiled kernels launched through the driver API; with
--device cpu (the dry run) the host build of the same source.

    python bench/device/nvrtc_identity.py [--device cuda]

device_codecs.py calls check() before it times the NVRTC rows (bench/device_check.sh,
section 2). NaN payloads are compared as NaNs (GPUs write other NaN bits).
"""

from __future__ import annotations

import argparse
import os

import torch

from neoxlab.compress import make_compressor
from neoxlab.compress.identity_vectors import data, same_values

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CASES = ([(spec, dt, 101 if spec.endswith("=3") else 1001)
          for spec in ("int8", "int4", "int8:block=3", "int4:block=64") for dt in DTYPES]
         + [("zfp:rate=1,impl=torch", torch.float32, 211),
            ("zfp:rate=8,impl=torch", torch.bfloat16, 211),
            ("zfp:rate=31,impl=torch", torch.float32, 211),
            ("zfp:rate=13,impl=torch", torch.float16, 211)]
         + [(f"zfp:rate={r},impl=torch", torch.float32, 4 * 1000 + 2) for r in range(1, 33)])


def _with_kernels(kind: str, fn):
    before = os.environ.get("NEOXLAB_CODEC_KERNELS")
    os.environ["NEOXLAB_CODEC_KERNELS"] = kind
    try:
        return fn()
    finally:
        if before is None:
            os.environ.pop("NEOXLAB_CODEC_KERNELS")
        else:
            os.environ["NEOXLAB_CODEC_KERNELS"] = before


def check(device: torch.device) -> list[str]:
    """The cases whose bytes or values differ (empty: all identical)."""
    failures = []
    for spec, dtype, n in CASES:
        c = make_compressor(spec)
        x = data(n, dtype)
        if c.coded_nbytes(n, dtype) >= n * dtype.itemsize:
            continue  # sent raw: nothing coded
        ref = _with_kernels("torch", lambda c=c, x=x: c.encode_fixed(x))
        ref_y = _with_kernels("torch", lambda c=c, r=ref, x=x: c.decode_fixed(r, x.numel(),
                                                                              x.dtype))
        got = _with_kernels("nvrtc", lambda c=c, x=x: c.encode_fixed(x.to(device)))
        got_y = _with_kernels("nvrtc", lambda c=c, r=ref, x=x: c.decode_fixed(
            r.to(device), x.numel(), x.dtype))
        if not torch.equal(got.cpu(), ref):
            failures.append(f"{spec} {dtype}: encoded bytes differ")
        if not same_values(got_y.cpu(), ref_y):
            failures.append(f"{spec} {dtype}: decoded values differ")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    dev = torch.device(ap.parse_args().device)
    failures = check(dev)
    for f in failures:
        print(f"NVRTC MISMATCH {f}")
    print(f"# nvrtc bit-identity on {dev}: {len(CASES) - len(failures)} of {len(CASES)} cases "
          f"{'OK' if not failures else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
