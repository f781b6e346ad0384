"""Compressor throughput next to a memcpy measured in the same run, plus ratio and error.

    python bench/compressors.py [--mib 64] [--threads 1] [--repeats 5]

Throughput is GB/s of input (10^9 bytes) for encode and decode of one fp32 tensor of
--mib MiB, built by tiling gradients captured from a small transformer (so data-dependent
codecs see real data), median of --repeats timed runs after a warm-up. The memcpy baseline
is ``src.clone()`` (like every encode/decode it allocates its output) timed in the same
run; ``dst.copy_(src)`` into a preallocated buffer is printed too. Ratios and relative
errors ||x - x'|| / ||x|| are computed on the captured gradients and activations
themselves. Goals: casts >= 0.5x memcpy, int8/int4 >= 0.2x, mpc >= 0.05x, for both encode
and decode.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from neoxlab.compress import make_compressor

SPECS = ["none", "fp16", "bf16", "int8", "int4", "mpc", "zfp:rate=8", "zfp:rate=16",
         "topk:ratio=0.01"]
GOALS = {"fp16": 0.5, "bf16": 0.5, "int8": 0.2, "int4": 0.2, "mpc": 0.05}


def capture(seed: int = 0) -> dict[str, torch.Tensor]:
    """Gradients and activations of a small transformer LM after one training step."""
    torch.manual_seed(seed)
    vocab, d, seq, batch = 512, 256, 64, 8
    emb = torch.nn.Embedding(vocab, d)
    layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    head = torch.nn.Linear(d, vocab)
    params = [*emb.parameters(), *enc.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    acts: list[torch.Tensor] = []
    for lay in enc.layers:
        lay.register_forward_hook(lambda m, i, o: acts.append(o.detach().reshape(-1)))
    for _ in range(2):
        acts.clear()
        opt.zero_grad()
        tok = torch.randint(0, vocab, (batch, seq))
        logits = head(enc(emb(tok)))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                 tok.roll(-1, 1).reshape(-1))
        loss.backward()
        opt.step()
    return {"grads": torch.cat([p.grad.reshape(-1) for p in params]), "acts": torch.cat(acts)}


def timed(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each fn over repeats rounds, after one warm-up round.

    The functions run interleaved (one call of each per round) so that a codec and its
    memcpy baseline see the same machine load, which matters on a shared box.
    """
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats + 1):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            if r:
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.double() - y.double()).norm() / x.double().norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=64.0, help="size of the timed fp32 tensor")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
    ap.add_argument("--specs", nargs="*", default=SPECS, help="compressor specs to run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    real = capture()
    n = int(args.mib * 2**20) // 4
    src = real["grads"].repeat(-(-n // real["grads"].numel()))[:n].contiguous()
    gb = src.nbytes / 1e9
    dst = torch.empty_like(src)
    t_clone, t_copy = timed([src.clone, lambda: dst.copy_(src)], args.repeats)
    print(f"# {src.nbytes / 2**20:.0f} MiB fp32 (tiled real gradients), {args.threads} thread(s),"
          f" median of {args.repeats}; torch {torch.__version__}")
    print(f"# memcpy: clone {gb / t_clone:.2f} GB/s, copy_ into preallocated "
          f"{gb / t_copy:.2f} GB/s; each row's ratios use a clone timed alongside it")
    print(f"# real data: {real['grads'].numel()} gradient values, "
          f"{real['acts'].numel()} activation values")
    head = (f"{'compressor':<16}{'enc GB/s':>9}{'dec GB/s':>9}{'mcpy GB/s':>9}"
            f"{'enc/mcpy':>9}{'dec/mcpy':>9}"
            f"{'ratio g':>9}{'ratio a':>9}{'relerr g':>10}{'relerr a':>10}  goal")
    print(head)
    print("-" * len(head))
    short = 0
    for spec in args.specs:
        c = make_compressor(spec)
        buf = c.encode(src)
        t_mem, t_enc, t_dec = timed(
            [src.clone, lambda c=c: c.encode(src), lambda c=c, buf=buf: c.decode(buf)],
            args.repeats)
        memcpy = gb / t_mem
        ratios, errs = [], []
        for key in ("grads", "acts"):
            x = real[key]
            b = c.encode(x)
            ratios.append(x.nbytes / b.numel())
            errs.append(rel_err(x, c.decode(b)))
        enc_r, dec_r = gb / t_enc / memcpy, gb / t_dec / memcpy
        goal = GOALS.get(c.name)
        verdict = "-"
        if goal is not None:
            ok = min(enc_r, dec_r) >= goal
            short += not ok
            verdict = f">={goal:g}x {'PASS' if ok else 'SHORT'}"
        print(f"{c.describe():<16}{gb / t_enc:>9.3f}{gb / t_dec:>9.3f}{memcpy:>9.2f}"
              f"{enc_r:>9.3f}{dec_r:>9.3f}"
              f"{ratios[0]:>9.2f}{ratios[1]:>9.2f}{errs[0]:>10.2e}{errs[1]:>10.2e}  {verdict}")
    print(f"# goals short: {short}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
