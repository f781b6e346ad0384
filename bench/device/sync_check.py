"""Host syncs of the compressed collectives: none for fixed-rate codecs, one per call
(whatever the group size and the number of segments) for data-dependent ones (mpc, topk).

    python bench/device/sync_check.py [--device cuda|cpu] [--mib 8] [--ranks 4]

On CUDA the count is torch's own (torch.cuda.set_sync_debug_mode("warn"): one warning per
synchronizing call); on CPU, where nothing waits, every call that reads a tensor's value on
the host is counted instead (item, tolist, cpu, bool, int, float, index, nonzero), with the
codecs' device paths forced. One process plays rank 0 of a loopback group
(bench/device/loopback.py). Exits 1 when a fixed-rate op syncs or a data-dependent one
syncs more than its bound (call_limit): one a call; the all-to-all all-reduce two (its second
phase encodes sums that exist only after the first), and with error feedback one plus one
per segment (the residual update keeps each segment's phases together).

The fixed-rate ops then run once more with syncs forbidden: on CUDA under
torch.cuda.set_sync_debug_mode("error") (any synchronizing call raises), on CPU with every
host read raising; an op that raises fails the check.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator

from loopback import LoopbackRaw  # bench/device/loopback.py (this script's folder)

MIB = 1 << 20
FIXED = ["fp16", "bf16", "int8", "zfp:rate=8"]  # on CPU zfp runs its torch path (the
# device-side code; the default there is a host library)
VARIABLE = ["mpc", "topk:ratio=0.01"]
READS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero")


@contextlib.contextmanager
def counted_syncs(device) -> Iterator[list[int]]:
    """[count] of host syncs (CUDA: torch's sync debug warnings; CPU: host reads)."""
    import torch

    box = [0]
    if device.type == "cuda":
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield box
            finally:
                torch.cuda.set_sync_debug_mode("default")
        box[0] = sum("synchroniz" in str(w.message) for w in caught)
        return
    patched = {}

    def counting(original):
        def run(*args, **kwargs):
            box[0] += 1
            return original(*args, **kwargs)
        return run

    for owner, name in [(torch.Tensor, m) for m in READS] + [(torch, "nonzero")]:
        patched[(owner, name)] = getattr(owner, name)
        setattr(owner, name, counting(patched[(owner, name)]))
    try:
        yield box
    finally:
        for (owner, name), original in patched.items():
            setattr(owner, name, original)


@contextlib.contextmanager
def forbidden_syncs(device) -> Iterator[None]:
    """Any host sync inside raises RuntimeError (CUDA: torch's "error" sync debug mode; CPU:
    the host reads counted_syncs counts)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return

    def raising(name):
        def run(*args, **kwargs):
            raise RuntimeError(f"host sync: {name}")
        return run

    patched = {(owner, name): getattr(owner, name)
               for owner, name in [(torch.Tensor, m) for m in READS] + [(torch, "nonzero")]}
    for owner, name in patched:
        setattr(owner, name, raising(name))
    try:
        yield
    finally:
        for (owner, name), original in patched.items():
            setattr(owner, name, original)


def raises_on_sync(device, call: Callable[[], object]) -> str | None:
    """The error a call raises with syncs forbidden, or None."""
    try:
        with forbidden_syncs(device):
            call()
    except RuntimeError as err:
        return str(err).splitlines()[0][:80]
    return None


def calls(device, mib: int, n: int, spec: str) -> Iterator[tuple[str, Callable[[], object]]]:
    import torch

    from neoxlab.comm import collectives as cc
    from neoxlab.compress import make_compressor

    c, raw = make_compressor(spec), LoopbackRaw(n)
    numel = mib * MIB // 4
    g = torch.Generator().manual_seed(0)
    x = torch.cumsum(torch.randn(numel, generator=g) * 1e-3, 0).to(device)  # mpc shrinks it
    res = torch.zeros_like(x)
    part = x[: numel // n].clone()
    outs = [torch.empty_like(part) for _ in range(n)]
    out = torch.empty(numel // n, device=device)
    yield "all_reduce", lambda: cc.all_reduce(raw, c, x.clone(), None, n, None, "alltoall")
    yield "all_reduce (EF)", lambda: cc.all_reduce(raw, c, x.clone(), None, n, res, "alltoall")
    yield "all_gather", lambda: cc.all_gather_into(raw, c, part, outs, None, n)
    yield "reduce_scatter", lambda: cc.reduce_scatter(raw, c, x, out, None, n)
    if c.fixed_nbytes(numel, x.dtype) is not None:  # p2p loopback payloads are zeros
        yield "reduce (owner)", lambda: cc.reduce(raw, c, x.clone(), 0, list(range(n)), 0,
                                                  None, res)
        yield "recv", lambda: cc.recv(raw, c, x.clone(), 1)
    yield "send", lambda: cc.send(raw, c, x, 1)
    yield "broadcast", lambda: cc.broadcast(raw, c, x.clone(), 0, 0, None)


def call_limit(op: str, segs: int) -> int:
    """Host syncs a call of a data-dependent codec may make (the module docstring says why)."""
    return {"all_reduce": 2, "all_reduce (EF)": 1 + segs}.get(op, 1)


def main(argv: list[str] | None = None) -> int:
    import torch

    from neoxlab.comm.collectives import segments
    from neoxlab.compress import mpc, topk

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--specs", nargs="+", help="a subset of the codecs (default: all)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        mpc.FORCE_DEVICE_PATH = topk.FORCE_DEVICE_PATH = True
    numel = args.mib * MIB // 4
    whole = len(segments(numel, 4))
    bad = 0
    print(f"{'codec':16} {'op':16} {'syncs':>6} {'segments':>8}  verdict"
          f"  (fixed rate: then with syncs forbidden)")
    fixed = [s + ",impl=torch" if device.type == "cpu" and s.startswith("zfp") else s
             for s in FIXED]
    for spec in fixed + VARIABLE:
        if args.specs and spec.split(",")[0] not in args.specs:
            continue
        for op, call in calls(device, args.mib, args.ranks, spec):
            call()  # warm: first-use tables and Triton compilation
            with counted_syncs(device) as box:
                call()
            segs = whole if op not in ("all_gather",) else len(segments(numel // args.ranks, 4))
            limit = 0 if spec in fixed else call_limit(op, segs)
            ok = box[0] <= limit
            raised = raises_on_sync(device, call) if spec in fixed else None
            bad += (not ok) + (raised is not None)
            forbidden = "" if spec not in fixed else (
                "  error mode: ok" if raised is None else f"  error mode RAISED: {raised}")
            print(f"{spec:16} {op:16} {box[0]:6d} {segs:8d}  "
                  f"{'ok' if ok else f'OVER {limit}'}{forbidden}", flush=True)
    print(f"sync_check: {'OK' if not bad else f'{bad} op(s) over their limit'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
