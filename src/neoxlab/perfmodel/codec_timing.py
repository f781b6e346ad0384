"""Codec throughput on this process's device: encode and decode of seeded gradient-like fp32
values timed on one thread (the ranks' setting), divided by the stretch the thread saw, so
the profile holds values for a core of one's own (perfmodel.stretch). The calibration
(commands/calibrate.py) and the tuner's in-situ profile (tune/insitu.py) time codecs alike.
"""

from __future__ import annotations

import statistics
import time

import torch

from neoxlab.compress import make_compressor
from neoxlab.config.profile import CodecProfile
from neoxlab.perfmodel.stretch import this_thread


def measure_codec(spec: str, small: int = 4096, large: int = 1 << 20, repeats: int = 7
                  ) -> tuple[CodecProfile, dict]:
    """Throughput from the large message, per-call cost from the small one (fp32 values),
    scaled to a core of its own by this thread's stretch while timing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    codec = make_compressor(spec)
    try:
        with this_thread() as seen:
            points = {n: _time_codec(codec, n, repeats) for n in (small, large)}
    finally:
        torch.set_num_threads(threads)
    (enc_s, dec_s, _), (enc_l, dec_l, ratio) = points[small], points[large]
    span = large - small
    enc_gbs = span / max(enc_l - enc_s, 1e-9) / 1e9
    dec_gbs = span / max(dec_l - dec_s, 1e-9) / 1e9
    call = max(0.0, (enc_s - small / (enc_gbs * 1e9) + dec_s - small / (dec_gbs * 1e9)) / 2)
    k = seen[0] or 1.0
    profile = CodecProfile(encode_gbs=enc_gbs * k, decode_gbs=dec_gbs * k,
                           call_us=call * 1e6 / k,
                           ratio=round(ratio, 4) if codec.lossless else None)
    raw = {"spec": spec, "sizes": [small, large], "stretch": k,
           "encode_s": [enc_s, enc_l], "decode_s": [dec_s, dec_l], "ratio_large": ratio}
    return profile, raw


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_codec(codec, nbytes: int, repeats: int) -> tuple[float, float, float]:
    """(encode s, decode s, ratio) of gradient-like fp32 values (seeded)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(nbytes // 4, generator=gen) * 1e-3
    buf = codec.encode(x)
    return (_median_time(lambda: codec.encode(x), repeats),
            _median_time(lambda: codec.decode(buf), repeats), x.nbytes / buf.numel())
