"""Compressed collectives between 4 processes sharing one GPU, through CompressionPatch, each
result checked against an uncompressed reference (section 6 of device_check.sh).

    python bench/device/exchange_check.py [--parts exchange halves] [--device cuda|cpu]

One GPU allows one NCCL rank, so the ranks talk over gloo with CUDA tensors: payloads are
encoded and decoded on the GPU (strict-device mode: every tensor handed to torch.distributed
is on the payload's device), and gloo moves them through host memory. gloo serves CUDA
tensors in its collectives but not in send/recv, so those two are staged through the host
here (`host_staged_p2p`), below the patch. `--device cpu`: the same program on CPU tensors,
the dry run that catches mistakes before a GPU run.

The 4 ranks form TP=1 x PP=2 x DP=2 (rank = 2*stage + data rank): the DP pairs are the
"dp" (reductions) and "zero" (gathers) groups, the stage pairs exchange "pp" send/recv, and
the world group is "other"; every dimension gets the codec under test. References are
computed locally from every rank's inputs (each rank draws all of them from fixed seeds):
exact equality for "none" and lossless codecs (integer-valued inputs, so any summation order
is exact), a relative error bound for lossy ones.

exchange: fp32; all-reduce (both algorithms), an async caller (async_op=True, then
  wait), reduce to one rank, all-gather, send/recv; error feedback against none.
halves: fp16 and bf16 through the same ops; then the fp16 loss scale: gradients
  scaled by it come back scaled, an overflow on one rank reaches every rank and leaves the
  error-feedback residual as it was, and a new loss scale rescales the residual.

The launcher (no --rank) starts the ranks, waits at most --timeout seconds, and exits 1
when any rank fails a check or does not finish.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import subprocess
import sys
import time
import warnings

RANKS = 4
FP32_SPECS = {"none": 0.0, "mpc": 0.0, "fp16": 2e-3, "int8": 0.05, "zfp:rate=8": 0.05}
HALF_SPECS = {"none": 0.0, "mpc": 0.0, "int8": 0.05, "zfp:rate=8": 0.05}
EF_SPEC, EF_STEPS = "zfp:rate=2", 8
LOSS_SCALE = 1024.0
CHECKS_FAILED = 2  # a rank's exit code when it ran to the end and some check failed


# ---- launcher ------------------------------------------------------------------------------
def launch(argv: list[str], timeout: float) -> int:
    """Start RANKS copies of this program with --rank; 0 when every one exits 0 in time.
    A rank that fails its checks exits CHECKS_FAILED after the others are done with it; any
    other failure (an exception) would leave the others waiting in a collective, so they are
    ended at once."""
    from neoxlab.run.dist import free_port

    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--rank", str(r),
                               "--port", port]) for r in range(RANKS)]
    deadline = time.monotonic() + timeout
    codes: list[int | None] = [None] * RANKS
    crashed = False
    while None in codes and time.monotonic() < deadline and not crashed:
        codes = [p.poll() for p in procs]
        crashed = any(code not in (None, 0, CHECKS_FAILED) for code in codes)
        time.sleep(0.2)  # polling the children's exit, not synchronizing with them
    for rank, (proc, code) in enumerate(zip(procs, codes, strict=True)):
        if code is None:
            why = "a rank crashed" if crashed else f"still running after {timeout:.0f} s"
            print(f"rank {rank}: {why}; killed", flush=True)
            proc.kill()
            proc.wait()
    ok = all(code == 0 for code in codes)
    print(f"exchange_check: {'OK' if ok else f'FAILED (exit codes {codes})'}", flush=True)
    return 0 if ok else 1


# ---- rank program ---------------------------------------------------------------------------
class Checks:
    """Named outcomes of one rank; a failure prints at once, the tally at the end."""

    def __init__(self, rank: int):
        self.rank, self.passed, self.failed = rank, 0, []

    def expect(self, name: str, ok: bool, detail: str = "") -> None:
        if ok:
            self.passed += 1
            return
        self.failed.append(name)
        print(f"rank {self.rank}: FAIL {name} {detail}", flush=True)


def host_staged_p2p():
    """dist.send/recv that take CUDA tensors over gloo by way of host copies (gloo's own
    send/recv read the tensor's memory from the host). Installed before the patch, so that
    its raw send/recv are these; CPU tensors go straight through."""
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in ("send", "recv")}

    def staged(name):
        original = originals[name]
        signature = inspect.signature(original)

        @functools.wraps(original)
        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            tensor = bound.arguments["tensor"]
            if tensor.device.type == "cpu":
                return original(*bound.args, **bound.kwargs)
            host = tensor.to("cpu")
            bound.arguments["tensor"] = host
            result = original(*bound.args, **bound.kwargs)
            if name == "recv":
                tensor.copy_(host)
            return result

        return call

    for name in originals:
        setattr(dist, name, staged(name))
    return lambda: [setattr(dist, name, fn) for name, fn in originals.items()]


def inputs(rank: int, numel: int, dtype, device, integers: bool, salt: int = 0):
    """Rank `rank`'s input, the same wherever it is drawn (references need everyone's)."""
    import torch

    g = torch.Generator().manual_seed(1000 * salt + rank)
    if integers:  # exact in fp16/bf16 and in any summation order
        x = torch.randint(-30, 31, (numel,), generator=g).float()
    else:
        x = torch.randn(numel, generator=g)
    return x.to(dtype).to(device)


def rel_err(got, want) -> float:
    import torch

    if not torch.isfinite(got).all():
        return float("inf")
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


def close(checks: Checks, name: str, got, want, bound: float) -> None:
    """Exact for bound 0 (lossless), else the relative error within bound."""
    import torch

    if bound == 0.0:
        checks.expect(name, torch.equal(got, want.to(got.dtype)),
                      f"max diff {float((got.double() - want.double()).abs().max()):.3g}")
    else:
        err = rel_err(got, want)
        checks.expect(name, err <= bound, f"rel. error {err:.3g} > {bound}")


class Rig:
    """The process groups and the patch factory of one rank."""

    def __init__(self, rank: int, device, numel: int):
        import torch.distributed as dist

        from neoxlab.comm.classify import Classifier, Grid

        self.rank, self.device, self.numel = rank, device, numel
        self.stage, self.d = divmod(rank, 2)
        self.peer = rank ^ 2  # the same data rank in the other stage
        self.dp_ranks = [2 * self.stage, 2 * self.stage + 1]
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes each
        self.dp_group = pairs[self.stage]
        self.classifier = Classifier(Grid(tp=1, pp=2, dp=2))

    def patch(self, spec: str, error_feedback: bool = False):
        from neoxlab.comm.patch import CompressionPatch
        from neoxlab.comm.scheme import DimCompression
        from neoxlab.compress import make_compressor

        if spec.startswith("zfp") and self.device.type == "cpu":
            spec += ",impl=torch"  # the device-side code; the CPU default is a host library
        policy = DimCompression(make_compressor(spec), 0, error_feedback)
        dims = {dim: policy for dim in ("dp", "zero", "pp", "other")}
        return CompressionPatch(dims, self.classifier, strict=True).install()

    def dp_sum(self, dtype, integers: bool, salt: int = 0):
        """The exact sum (fp64) of this rank's DP pair's inputs in dtype."""
        return sum(inputs(r, self.numel, dtype, self.device, integers, salt).double()
                   for r in self.dp_ranks)


def ops(checks: Checks, rig: Rig, spec: str, dtype, bound: float) -> None:
    """All-reduce (DP pair: all-gather algorithm; world: all-to-all), async all-reduce,
    reduce, all-gather and send/recv of one codec and dtype, against references."""
    import torch
    import torch.distributed as dist

    me, dev, n = rig.rank, rig.device, rig.numel
    tag = f"{spec}/{str(dtype).removeprefix('torch.')}"
    integers = bound == 0.0
    mine = inputs(me, n, dtype, dev, integers)
    world_sum = sum(inputs(r, n, dtype, dev, integers).double() for r in range(RANKS))
    patch = rig.patch(spec)
    try:
        x = mine.clone()
        dist.all_reduce(x, group=rig.dp_group)
        close(checks, f"{tag} all_reduce dp pair", x, rig.dp_sum(dtype, integers), bound)
        x = mine.clone()
        dist.all_reduce(x)
        close(checks, f"{tag} all_reduce world", x, world_sum, bound)
        x = mine.clone()
        work = dist.all_reduce(x, async_op=True)
        checks.expect(f"{tag} async work", work is not None and work.wait() is not False)
        close(checks, f"{tag} async all_reduce", x, world_sum, bound)
        x = mine.clone()
        owner = rig.dp_ranks[1]
        dist.reduce(x, dst=owner, group=rig.dp_group)
        if me == owner:
            close(checks, f"{tag} reduce (owner)", x, rig.dp_sum(dtype, integers), bound)
        elif spec != "none":  # torch leaves a sender's tensor unspecified; ours keep it
            checks.expect(f"{tag} reduce leaves the sender's input", torch.equal(x, mine))
        out = torch.empty(2 * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, mine, group=rig.dp_group)
        for i, r in enumerate(rig.dp_ranks):
            close(checks, f"{tag} all_gather part {i}", out[i * n:(i + 1) * n],
                  inputs(r, n, dtype, dev, integers), bound)
        if rig.stage == 0:
            dist.send(mine, dst=rig.peer)
        else:
            got = torch.empty_like(mine)
            dist.recv(got, src=rig.peer)
            close(checks, f"{tag} send/recv", got, inputs(rig.peer, n, dtype, dev, integers),
                  bound)
        stats = patch.accountant.stats
        expected = 0 if spec == "none" else 1
        for dim, op in (("dp", "all_reduce"), ("other", "all_reduce"), ("dp", "reduce"),
                        ("zero", "all_gather_into_tensor"), ("pp", "send" if rig.stage == 0
                                                              else "recv")):
            calls = stats[(dim, op)].compressed_calls
            checks.expect(f"{tag} {dim} {op} compressed", (calls > 0) == bool(expected),
                          f"{calls} compressed calls")
    finally:
        patch.uninstall()


def error_feedback(checks: Checks, rig: Rig) -> None:
    """Repeated DP all-reduces of the same gradient with a coarse codec: the running sum of
    results tracks the exact one far better with error feedback than without."""
    import torch
    import torch.distributed as dist

    grad = inputs(rig.rank, rig.numel, torch.float32, rig.device, False, salt=7)
    truth = rig.dp_sum(torch.float32, False, salt=7) * EF_STEPS
    errors = {}
    for feedback in (True, False):
        patch = rig.patch(EF_SPEC, error_feedback=feedback)
        try:
            total = torch.zeros_like(grad)
            for _ in range(EF_STEPS):
                patch.begin_step()
                x = grad.clone()
                dist.all_reduce(x, group=rig.dp_group)
                total += x
            errors[feedback] = rel_err(total, truth)
            if feedback:
                checks.expect("error feedback keeps one residual", len(patch.residuals) == 1,
                              f"{len(patch.residuals)} residuals")
        finally:
            patch.uninstall()
    checks.expect("error feedback beats none", errors[True] < errors[False] / 2,
                  f"with {errors[True]:.3g}, without {errors[False]:.3g}")


def loss_scale(checks: Checks, rig: Rig) -> None:
    """fp16 gradients carry the loss scale through a compressed all-reduce with error
    feedback; an Inf on one rank reaches every rank and the residual stays as it was; when
    the scaler halves the scale, begin_step rescales the residual to it."""
    import torch
    import torch.distributed as dist

    me, dev, n = rig.rank, rig.device, rig.numel
    grad = inputs(me, n, torch.float32, dev, False, salt=11) * 0.01
    exact = sum(inputs(r, n, torch.float32, dev, False, salt=11) * 0.01
                for r in rig.dp_ranks)
    patch = rig.patch("zfp:rate=8", error_feedback=True)
    try:
        patch.begin_step(loss_scale=LOSS_SCALE)
        x = (grad * LOSS_SCALE).half()
        dist.all_reduce(x, group=rig.dp_group)
        checks.expect("fp16 scaled gradients stay finite", bool(torch.isfinite(x).all()))
        close(checks, "fp16 scaled all_reduce / scale", x.float() / LOSS_SCALE, exact, 0.05)
        (residual,) = patch.residuals.values()
        before = residual.clone()
        checks.expect("fp16 residual nonzero", bool(before.abs().max() > 0))
        patch.begin_step(loss_scale=LOSS_SCALE)
        bad = (grad * LOSS_SCALE).half()
        if me == rig.dp_ranks[1]:
            bad[17] = float("inf")
        dist.all_reduce(bad, group=rig.dp_group)
        checks.expect("overflow reaches every rank", not bool(torch.isfinite(bad).all()))
        checks.expect("overflow leaves the residual", torch.equal(residual, before))
        patch.begin_step(loss_scale=LOSS_SCALE / 2)
        checks.expect("new loss scale rescales the residual",
                      torch.equal(residual, before * 0.5))
        x = (grad * (LOSS_SCALE / 2)).half()
        dist.all_reduce(x, group=rig.dp_group)
        close(checks, "fp16 all_reduce after the rescale / scale",
              x.float() / (LOSS_SCALE / 2), exact, 0.05)
    finally:
        patch.uninstall()


def chosen(specs: dict[str, float], subset: list[str] | None) -> dict[str, float]:
    """The codecs (and their bounds) named in `subset`; all of them without one."""
    return {s: b for s, b in specs.items() if not subset or s in subset}


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    # torch names all_gather_into_tensor deprecated; DeepSpeed and the patch still call it
    warnings.filterwarnings("ignore", ".*all_gather_into_tensor", FutureWarning)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU
        device = torch.device("cuda", 0)
    dist.init_process_group("gloo", rank=args.rank, world_size=RANKS,
                            init_method=f"tcp://127.0.0.1:{args.port}")
    start = time.perf_counter()
    restore = host_staged_p2p()
    checks = Checks(args.rank)
    rig = Rig(args.rank, device, args.numel)
    try:
        if "exchange" in args.parts:
            for spec, bound in chosen(FP32_SPECS, args.specs).items():
                ops(checks, rig, spec, torch.float32, bound)
            error_feedback(checks, rig)
        if "halves" in args.parts:
            for dtype in (torch.float16, torch.bfloat16):
                for spec, bound in chosen(HALF_SPECS, args.specs).items():
                    ops(checks, rig, spec, dtype, bound)
            loss_scale(checks, rig)
        dist.barrier()
    finally:
        restore()
    print(f"rank {args.rank}: {checks.passed} checks passed, {len(checks.failed)} failed "
          f"({time.perf_counter() - start:.1f} s)", flush=True)
    dist.destroy_process_group()
    return CHECKS_FAILED if checks.failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=("exchange", "halves"),
                    default=["exchange", "halves"])
    ap.add_argument("--device", default="cuda", help="cpu: the dry run, CPU tensors")
    ap.add_argument("--numel", type=int, default=(1 << 20) + 37,
                    help="values per rank (not a multiple of the codecs' blocks)")
    ap.add_argument("--specs", nargs="+", help="a subset of the codecs (default: all)")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds for every rank")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    unknown = set(args.specs or ()) - set(FP32_SPECS) - set(HALF_SPECS)
    if unknown:
        ap.error(f"--specs {sorted(unknown)}: not among the checked codecs "
                 f"{sorted(set(FP32_SPECS) | set(HALF_SPECS))}; name some of those")
    if args.rank is None:
        return launch(argv, args.timeout)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
