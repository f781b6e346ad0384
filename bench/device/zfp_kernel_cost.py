"""The fused ZFP kernels' cost without a GPU: compile them for explicit targets (sm_90: H100,
H200; sm_70: V100) with Triton's own compiler and ptxas, read the SASS, and count what one
value costs: instructions executed and global loads issued, per thread, times the threads,
over the values a program codes.

    python bench/device/zfp_kernel_cost.py [--rate 8] [--targets 90 70]

Counts are dynamic where the code is straight: each instruction once, the body of the
kernel's one runtime loop (the 32 bit planes) 32 times; predicated instructions count as
executed (the GPU issues them). Global loads are LDG instructions (input values and the
coder's lookup tables); a vectorized load counts once; local loads and stores (LDL/STL:
register spills) apart. Counted in the SASS (Triton's cuobjdump) where it can disassemble
the target, and in the PTX for every target (CUDA 13's cuobjdump no longer reads sm_70
cubins; ptxas still builds them): PTX instructions and ld.global, the same way.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PLANES = 32  # trips of the kernels' one runtime loop
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def compile_kernels(rate: int, cc: int) -> dict[str, tuple[bytes, str, dict]]:
    """{kernel: (cubin, ptx, metadata)} of ZFP encode and decode, fp32, for sm_<cc>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from neoxlab.compress import triton_kernels as tk
    from neoxlab.compress import zfp_torch

    target = GPUTarget("cuda", cc, 32)
    options = {"enable_fp_fusion": False, "num_warps": 4}  # as the kernels are launched
    encode_lanes = getattr(tk, "_ZFP_ENCODE_LANES", getattr(tk, "_ZFP_LANES", 64))
    decode_lanes = getattr(tk, "_ZFP_DECODE_LANES", getattr(tk, "_ZFP_LANES", 64))
    decode_args = {"in_ptr": "*u8", "out_ptr": "*fp32", "dec_ptr": "*i64",
                   "vclass_ptr": "*i64", "n4": "i64", "nblocks": "i64"}
    decode_args = {k: v for k, v in decode_args.items()
                   if k in tk._zfp_decode_kernel.arg_names}  # (vclass: before only)
    kernels = {
        "encode": (tk._zfp_encode_kernel,
                   {"x_ptr": "*fp32", "out_ptr": "*u8", "enc_ptr": "*i64",
                    "bitlen_ptr": "*i64", "rows": "i64", "nblocks": "i64"},
                   {"RATE": rate, "LANES": encode_lanes,
                    "NBYTES_P2": triton.next_power_of_2(2 * rate)},
                   encode_lanes * 16),
        "decode": (tk._zfp_decode_kernel, decode_args,
                   {"RATE": rate, "LANES": decode_lanes, "STATE": zfp_torch._STATE,
                    "STEPS": zfp_torch._STEPS, "BF16": False},
                   decode_lanes * 16),
    }
    out = {}
    for name, (fn, signature, constexprs, values) in kernels.items():
        sig = {**signature, **{k: "constexpr" for k in constexprs}}
        compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                                  target=target, options=options)
        meta = {"num_warps": compiled.metadata.num_warps, "values": values,
                "registers": getattr(compiled, "n_regs", None)}
        out[name] = (compiled.asm["cubin"], compiled.asm["ptx"], meta)
    return out


PTX_LINE = re.compile(r"^\s*(@!?%p\d+\s+)?([a-z][a-z0-9_.]*)\s*([^;]*);", re.M)
PTX_LABEL = re.compile(r"^(\$L__\w+):", re.M)


def ptx_of(ptx: str) -> list[tuple[int, str, str]]:
    """(position, opcode, operands) of every PTX instruction of the kernel's body; labels
    as ("label", name) at their position, so that loops can be found."""
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    out: list[tuple[int, str, str]] = []
    for i, line in enumerate(body.splitlines()):
        label = PTX_LABEL.match(line)
        if label:
            out.append((i, "label", label.group(1)))
            continue
        m = PTX_LINE.match(line)
        if m and not m.group(2).startswith((".", "//")) and m.group(2) not in ("ret",):
            out.append((i, m.group(2), m.group(3)))
    return out


def ptx_cost(code: list[tuple[int, str, str]]) -> dict[str, int]:
    """cost() over PTX: the body between a label and the branch back to it runs 32 times."""
    labels = {operands: at for at, op, operands in code if op == "label"}
    loops = [(labels[operands.strip()], at) for at, op, operands in code
             if op.startswith("bra") and labels.get(operands.strip(), at + 1) < at]
    if len(loops) > 1:
        raise SystemExit(f"{len(loops)} loops: this count assumes the kernel's one plane loop")
    body = loops[0] if loops else (0, -1)
    executed = {"instructions": 0, "global_loads": 0, "local": 0}
    for at, op, _ in code:
        if op == "label":
            continue
        times = PLANES if body[0] <= at <= body[1] else 1
        executed["instructions"] += times
        executed["global_loads"] += times * op.startswith("ld.global")
        executed["local"] += times * op.startswith(("ld.local", "st.local"))
    executed["static"] = sum(op != "label" for _, op, _ in code)
    executed["loop_body"] = sum(op != "label" and body[0] <= at <= body[1]
                                for at, op, _ in code)
    return executed


def sass_of(cubin: bytes) -> list[tuple[int, str, str]] | None:
    """(address, opcode, operands) of every instruction, from Triton's own cuobjdump; None
    when it cannot disassemble the target."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([str(tool), "-sass", str(path)], capture_output=True, text=True,
                              check=False)
        if done.returncode:
            return None
        text = done.stdout
    return [(int(m.group(1), 16), m.group(3), m.group(4)) for m in LINE.finditer(text)]


def cost(sass: list[tuple[int, str, str]]) -> dict[str, int]:
    """Per thread: instructions and global loads executed (the plane loop's body 32
    times), and the static counts."""
    body = (0, -1)
    loops = []
    for addr, op, operands in sass:
        if op == "BRA":
            target = int(operands.split()[-1].rstrip(";"), 16)
            if target < addr:
                loops.append((target, addr))
    if len(loops) > 1:
        raise SystemExit(f"{len(loops)} loops: this count assumes the kernel's one plane loop")
    if loops:
        body = loops[0]
    executed = {"instructions": 0, "global_loads": 0, "local": 0}
    for addr, op, _ in sass:
        if op in ("NOP",) or (op == "BRA" and addr == sass[-1][0]):
            continue
        times = PLANES if body[0] <= addr <= body[1] else 1
        executed["instructions"] += times
        executed["global_loads"] += times * op.startswith("LDG")
        executed["local"] += times * op.startswith(("LDL", "STL"))
    executed["static"] = len(sass)
    executed["loop_body"] = sum(1 for a, _, _ in sass if body[0] <= a <= body[1])
    return executed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=8)
    ap.add_argument("--targets", type=int, nargs="+", default=[90, 70])
    args = ap.parse_args(argv)
    print(f"ZFP rate {args.rate}, fp32; per value = per-thread count x threads / values of a "
          "program")
    print(f"{'kernel':7} {'target':6} {'code':4} {'instr/value':>11} {'loads/value':>11} "
          f"{'local/value':>11} {'static':>6} {'loop body':>9} {'threads':>7} {'values':>6}")
    for cc in args.targets:
        for name, (cubin, ptx, meta) in compile_kernels(args.rate, cc).items():
            threads = meta["num_warps"] * 32
            per = threads / meta["values"]
            sass = sass_of(cubin)
            counted = [("sass", cost(sass))] if sass is not None else []
            for code, c in [*counted, ("ptx", ptx_cost(ptx_of(ptx)))]:
                print(f"{name:7} sm_{cc:<3} {code:4} {c['instructions'] * per:11.1f} "
                      f"{c['global_loads'] * per:11.2f} {c['local'] * per:11.2f} "
                      f"{c['static']:6} {c['loop_body']:9} {threads:7} {meta['values']:6}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
