"""ZFP fixed-rate on CPU tensors through torch.compile (inductor's C++/OpenMP backend).

Opt-in with NEOXLAB_CODEC_KERNELS=compile (kernels.py). The block-per-lane stages of
zfp_fused.py are compiled separately (encode: block transform, one bit plane; decode:
one bit plane, inverse transform) and called from Python once per bit plane that still
has budget (at most 32 per chunk): compiling the whole 32-plane coder as one graph took
2-10 minutes here and the decoder's crashed gcc 12 (internal compiler error).
Same bytes as zfp_torch (tests).

Compiling takes about 1-2 minutes per process on a busy 2-core machine (plus ~30 s per
further rate), which is why this is not the default. Where compilation is unavailable (no
C++ compiler) or fails, one warning is logged and the eager reference (zfp_torch) runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from neoxlab.compress import zfp_fused, zfp_torch

log = logging.getLogger(__name__)

CHUNK_BLOCKS = 1 << 16  # blocks per compiled call: few Python calls, state stays in L2
_STAGES: dict[str, Callable] = {}
_DISABLED: list[str] = []  # the reason, once compiling has failed or cannot work


def _disable(reason: str) -> None:
    if not _DISABLED:
        log.warning("zfp: torch.compile unavailable (%s); running the eager torch coder "
                    "(same bytes, slower); unset NEOXLAB_CODEC_KERNELS=compile to silence",
                    reason)
        _DISABLED.append(reason)


def stages() -> dict[str, Callable] | None:
    """The compiled stages, or None where torch.compile cannot run here."""
    if _DISABLED:
        return None
    if not _STAGES:
        try:
            # deferred: inductor's builder, only when the compiled coder is first built
            from torch._inductor import cpp_builder

            cpp_builder.get_cpp_compiler()  # raises when no C++ compiler is found
        except Exception as err:  # noqa: BLE001 - any failure means: no compiled path
            _disable(f"no C++ compiler for inductor: {err}")
            return None
        for name in ("encode_prologue", "encode_plane", "decode_plane", "decode_epilogue"):
            _STAGES[name] = torch.compile(getattr(zfp_fused, name), dynamic=True)
    return _STAGES


def encode(vals: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.encode."""
    st = stages()
    if st is not None:
        blocks = zfp_torch._blocks(vals)
        dst = out.view(blocks.shape[0], 2 * rate)
        enc = zfp_torch._encode_table(vals.device)
        try:
            for b0 in range(0, blocks.shape[0], CHUNK_BLOCKS):
                chunk = blocks[b0: b0 + CHUNK_BLOCKS]
                dst[b0: b0 + chunk.shape[0]].copy_(zfp_fused.encode_chunk(
                    chunk, rate, enc, st["encode_prologue"], st["encode_plane"]))
            return
        except Exception as err:  # noqa: BLE001 - a failed compile falls back to eager
            _disable(f"{type(err).__name__}: {str(err)[:200]}")
    zfp_torch.encode(vals, rate, out)


def decode(payload: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.decode."""
    st = stages()
    if st is not None:
        n4 = out.numel()
        nb = -(-n4 // 16)
        src = payload[: 2 * rate * nb].view(nb, 2 * rate)
        table = zfp_torch._decode_table(payload.device)
        try:
            for b0 in range(0, nb, CHUNK_BLOCKS):
                vals = zfp_fused.decode_chunk(
                    src[b0: b0 + CHUNK_BLOCKS], rate, table, st["decode_plane"],
                    st["decode_epilogue"]).reshape(-1)
                lo = b0 * 16
                m = min(vals.numel(), n4 - lo)
                out[lo: lo + m].copy_(vals[:m])
            return
        except Exception as err:  # noqa: BLE001 - a failed compile falls back to eager
            _disable(f"{type(err).__name__}: {str(err)[:200]}")
    zfp_torch.decode(payload, rate, out)
