"""Compressor throughput next to a memcpy measured in the same run, plus ratio and error.

    python bench/compressors.py [--mib 64] [--threads 1] [--repeats 5] [--clock wall|cpu]

Throughput is GB/s of input (10^9 bytes) for encode and decode of one fp32 tensor of
--mib MiB built by tiling gradients captured from a small transformer (so data-dependent
codecs see real data); median of --repeats rounds after a warm-up round. Each round times
the codec's encode and decode interleaved with two memcpy baselines of the same tensor, so
a row and its baselines see the same machine load:

  clone  ``src.clone()``: allocates its output, as every encode/decode does (the goals are
         judged against it);
  copy_  ``dst.copy_(src)`` into a preallocated buffer: pure bandwidth, the stricter
         baseline (reported alongside).

Codecs that send the gradients raw (mpc: gradients are incompressible for it) get a second
row timed on a smooth field ("[smooth]"). Ratio "t" is on the timed tensor; ratios and
relative errors ||x - x'|| / ||x|| "g"/"a" are on the captured gradients / activations.
Goals: casts >= 0.5x memcpy, int8/int4 >= 0.2x, mpc >= 0.05x, for encode and decode;
our torch ZFP (``zfp``) >= 1x the ZFP library (``zfp:impl=zfpy``) at the same rate, in a
closing "zfp torch / zfpy" line. ``--threads 0`` uses every core (zfpy itself is serial).
A spec ending in ``@K`` runs with NEOXLAB_CODEC_KERNELS=K (``@compile``: our ZFP through
torch.compile on CPU; its compile time falls in the untimed first calls).

Large allocations use transparent huge pages (THP_MEM_ALLOC_ENABLE=1, set before torch is
imported; --no-thp turns it off): otherwise each 64 MiB allocation costs ~16k page faults
that dominate every number on a VM (clone ~1 GB/s instead of ~11).
"""

from __future__ import annotations

import os
import sys

if "--no-thp" not in sys.argv:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

from neoxlab.compress import make_compressor  # noqa: E402

SPECS = ["none", "fp16", "bf16", "int8", "int4", "mpc", "zfp:rate=8,impl=torch",
         "zfp:rate=8,impl=torch@compile", "zfp:rate=8,impl=zfpy", "zfp:rate=16,impl=torch",
         "zfp:rate=16,impl=torch@compile", "zfp:rate=16,impl=zfpy", "topk:ratio=0.01"]
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


def timed(fns: list[Callable[[], object]], repeats: int, clock: Callable[[], float]
          ) -> list[float]:
    """Median seconds of each fn over repeats rounds (one call of each per round)."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats + 1):  # round 0 is a warm-up
        for fn, ts in zip(fns, times, strict=True):
            t0 = clock()
            fn()
            if r:
                ts.append(clock() - t0)
    return [statistics.median(ts) for ts in times]


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.double() - y.double()).norm() / x.double().norm())


def verdict(name: str, enc: float, dec: float, enc_cp: float, dec_cp: float) -> str:
    goal = GOALS.get(name)
    if goal is None:
        return "-"
    main = "PASS" if min(enc, dec) >= goal else "SHORT"
    strict = "PASS" if min(enc_cp, dec_cp) >= goal else "SHORT"
    return f">={goal:g}x {main} (copy_ {strict})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=64.0, help="size of the timed fp32 tensor")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: all)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: perf_counter; cpu: process time (less noisy on a shared box)")
    ap.add_argument("--specs", nargs="*", default=SPECS, help="compressor specs to run")
    ap.add_argument("--no-thp", action="store_true", help="no transparent huge pages")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    clock = time.perf_counter if args.clock == "wall" else time.process_time

    real = capture()
    n = int(args.mib * 2**20) // 4
    grads = real["grads"].repeat(-(-n // real["grads"].numel()))[:n].contiguous()
    lin = torch.linspace(0, 1, n)
    smooth = torch.sin(lin * 1000) * lin
    gb = grads.nbytes / 1e9
    print(f"# {grads.nbytes / 2**20:.0f} MiB fp32, {torch.get_num_threads()} thread(s), median of "
          f"{args.repeats}, {args.clock} clock, THP {os.environ.get('THP_MEM_ALLOC_ENABLE')}"
          f"; torch {torch.__version__}")
    print(f"# real data: {real['grads'].numel()} gradient and {real['acts'].numel()} "
          "activation values; GB/s of input, ratios vs memcpy timed in the same rounds")
    head = (f"{'compressor':<32}{'enc':>7}{'dec':>7}{'clone':>7}{'copy_':>7}"
            f"{'enc/cl':>7}{'dec/cl':>7}{'enc/cp':>7}{'dec/cp':>7}"
            f"{'ratio t':>8}{'g':>6}{'a':>6}{'relerr g':>10}{'a':>9}  goal")
    print(head)
    print("-" * (len(head) + 24))
    short = 0
    speeds: dict[str, tuple[float, float]] = {}
    default_kernels = os.environ.get("NEOXLAB_CODEC_KERNELS", "auto")
    for entry in args.specs:
        spec, _, kernels = entry.partition("@")
        os.environ["NEOXLAB_CODEC_KERNELS"] = kernels or default_kernels
        c = make_compressor(spec)
        name = c.describe() + (f"@{kernels}" if kernels else "")
        ratios, errs = [], []
        for key in ("grads", "acts"):
            b = c.encode(real[key])
            ratios.append(real[key].nbytes / b.numel())
            errs.append(rel_err(real[key], c.decode(b)))
        for label, src in (("", grads), (" [smooth]", smooth)):
            if label and not (c.lossless and c.name != "none"):
                continue  # the smooth row is for lossless codecs that depend on the data
            buf = c.encode(src)
            dst = torch.empty_like(src)
            t_cl, t_cp, t_enc, t_dec = timed(
                [src.clone, lambda d=dst, s=src: d.copy_(s), lambda c=c, s=src: c.encode(s),
                 lambda c=c, b=buf: c.decode(b)], args.repeats, clock)
            enc, dec = gb / t_enc, gb / t_dec
            speeds[name + label] = (enc, dec)
            cl, cp = gb / t_cl, gb / t_cp
            v = verdict(c.name, enc / cl, dec / cl, enc / cp, dec / cp)
            short += "SHORT (" in v
            print(f"{name + label:<32}{enc:>7.2f}{dec:>7.2f}{cl:>7.2f}{cp:>7.2f}"
                  f"{enc / cl:>7.3f}{dec / cl:>7.3f}{enc / cp:>7.3f}{dec / cp:>7.3f}"
                  f"{src.nbytes / buf.numel():>8.2f}{ratios[0]:>6.2f}{ratios[1]:>6.2f}"
                  f"{errs[0]:>10.2e}{errs[1]:>9.2e}  {v}")
    for key, (enc, dec) in speeds.items():
        if key.startswith("zfp(") and "impl=torch" in key:
            lib = speeds.get(key.replace("impl=torch", "impl=zfpy").split("@")[0])
            if lib:
                ok = "PASS" if min(enc / lib[0], dec / lib[1]) >= 1 else "SHORT"
                print(f"# zfp torch / zfpy, {key}: encode {enc / lib[0]:.2f}x, decode "
                      f"{dec / lib[1]:.2f}x  goal >=1x {ok}")
    print(f"# rows short of their goal against clone: {short}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
