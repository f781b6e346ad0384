"""The assumptions of a Lassen prediction and the values the sensitivity table tries for each,
with how each value is known: the wire dtype per dimension, who compresses, codec speed, the
efficiency of MPI collectives on GPU buffers inside and across nodes, overlap, batch and
accumulation, the layout (perfmodel.sensitivity solves and tables them)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.perfmodel.sensitivity import Assumption, Case, Knob, Value
from neoxlab.perfmodel.traffic import WIRE_DIMS

# MPI collectives on GPU buffers reach ~95 % of NVLink and ~99 % of EDR point to point on
# OpenPOWER nodes (Khorassani et al., ISC 2019)
KHORASSANI = "published: Khorassani et al., ISC 2019 (MPI point to point on OpenPOWER)"


def with_section(cfg: Config, **sections: dict) -> Config:
    """cfg with some fields of some sections replaced: with_section(cfg, parallel={'tp': 2})."""
    changes = {name: dataclasses.replace(getattr(cfg, name), **fields)
               for name, fields in sections.items()}
    return dataclasses.replace(cfg, **changes)


def each_config(case: Case, **sections: dict) -> Case:
    configs = {s: with_section(c, **sections) for s, c in case.configs.items()}
    return dataclasses.replace(case, configs=configs)


def wire(dtypes: dict[str, str]) -> Callable[[Case], Case]:
    return lambda case: dataclasses.replace(case, dtypes={**case.dtypes, **dtypes})


def codec_speed(case: Case, gbs: float) -> Case:
    """Every codec at `gbs` GB/s both ways, whatever kernel path it would take; infinite:
    free (no per-call cost either)."""
    p = case.profile
    codecs = {name: dataclasses.replace(c, encode_gbs=gbs, decode_gbs=gbs, torch_encode_gbs=None,
                                        torch_decode_gbs=None, nvrtc_encode_gbs=None,
                                        nvrtc_decode_gbs=None,
                                        call_us=0.0 if math.isinf(gbs) else c.call_us)
              for name, c in p.codecs.items()}
    return dataclasses.replace(case, profile=dataclasses.replace(p, codecs=codecs))


def fused_kernels(profile: PerfProfile) -> PerfProfile:
    """The profile with its codecs on fused GPU kernels at the profile's encode_gbs: neither
    the NVRTC kernels' nor the torch-ops fallback's speed priced (Triton-class kernels)."""
    codecs = {name: dataclasses.replace(c, torch_encode_gbs=None, torch_decode_gbs=None,
                                        nvrtc_encode_gbs=None, nvrtc_decode_gbs=None)
              for name, c in profile.codecs.items()}
    return dataclasses.replace(profile, codecs=codecs)


def fused(case: Case) -> Case:
    return dataclasses.replace(case, profile=fused_kernels(case.profile))


def torch_ops(case: Case) -> Case:
    """No NVRTC path on the cluster: a GPU without Triton runs the codecs' torch ops."""
    p = case.profile
    codecs = {name: dataclasses.replace(c, nvrtc_encode_gbs=None, nvrtc_decode_gbs=None)
              for name, c in p.codecs.items()}
    return dataclasses.replace(case, profile=dataclasses.replace(p, codecs=codecs))


def efficiency(link: str) -> Callable[[Case, float], Case]:
    """The link's bandwidths (ring and full) scaled by e: MPI on GPU buffers below the wire."""
    def apply(case: Case, e: float) -> Case:
        lp = getattr(case.profile, link)
        scaled = dataclasses.replace(
            lp, bandwidth_gbs=lp.bandwidth_gbs * e,
            full_gbs=None if lp.full_gbs is None else lp.full_gbs * e)
        return dataclasses.replace(case, profile=dataclasses.replace(case.profile,
                                                                     **{link: scaled}))
    return apply


def overlap(case: Case, x: float) -> Case:
    profile = dataclasses.replace(case.profile, dp_overlap=x, zero_overlap=x)
    return dataclasses.replace(case, profile=profile)


def achievable(case: Case, tflops: float) -> Case:
    return dataclasses.replace(case, profile=dataclasses.replace(case.profile,
                                                                 achievable_tflops=tflops))


def accumulation(case: Case, k: float) -> Case:
    return each_config(case, parallel={"grad_accum": int(k)})


def library(dtypes: dict[str, str]) -> Callable[[Case], Case]:
    """The MPI library compresses under its documented rules (the profile's), not our patch."""
    def apply(case: Case) -> Case:
        changed = each_config(case, compression={"backend": "mpi"},
                              cluster={"mpi_library": "mvapich-plus"})
        return wire(dtypes)(changed)
    return apply


def layout(tp: int, nodes: int, grad_accum: int) -> Callable[[Case], Case]:
    """Another layout at PP 4, micro batch 4, the vocabulary padded as GPT-NeoX-20B pads it
    (128 x TP). TP 2 does not fit a 16 GiB V100 by neoxlab's memory estimate; it is
    predicted as on GPT-NeoX's own 40 GB A100s, the rest of the profile unchanged."""
    def apply(case: Case) -> Case:
        changed = each_config(case, parallel={"tp": tp, "grad_accum": grad_accum},
                              cluster={"nodes": nodes, "device_memory_gib": 40.0},
                              model={"make_vocab_size_divisible_by": 128})
        note = (f"TP {tp}: TP groups inside a GPU pair would have NVLink2's 75 GB/s, not the "
                "4-GPU ring's 32 GB/s the profile gives every intra-node group")
        return dataclasses.replace(changed, notes=(*changed.notes, note) if tp == 2 else
                                   changed.notes)
    return apply


def _same(case: Case) -> Case:
    return case


def combined(*changes: Callable[[Case], Case]) -> Callable[[Case], Case]:
    def apply(case: Case) -> Case:
        for change in changes:
            case = change(case)
        return case
    return apply


# ---- the rows -----------------------------------------------------------------------------

def assumptions(profile: PerfProfile) -> list[Assumption]:
    """Every assumption with its values; the first value of each is the base case's."""
    mark = profile.provenance.get
    all32 = dict.fromkeys(WIRE_DIMS, "fp32")
    wire_base = ("assumed: DeepSpeed's and GPT-NeoX's defaults (no communication_data_type, "
                 "no fp32_allreduce); the paper's setting is not published")
    doc = mark("mpi_compression.mvapich-plus", "assumed: no source in the profile")
    return [
        Assumption("wire dtype (per dimension)", [
            Value("as configured: fp16 (training precision)", wire_base, _same),
            *[Value(f"{dim} fp32", "assumed: a what-if", wire({dim: "fp32"}))
              for dim in WIRE_DIMS],
            Value("all fp32", "assumed: a what-if (MVAPICH compresses fp32 only)", wire(all32)),
        ]),
        Assumption("who compresses", [
            Value("neoxlab's codecs (framework)", "assumed: our runs' backend", _same),
            Value("MVAPICH-Plus rules, wire as configured", doc, library({})),
            Value("MVAPICH-Plus rules, all fp32", doc, library(all32)),
        ]),
        Assumption("codec kernels on the GPU", [
            Value("as the cluster runs them (cluster.arch; ppc64le: NVRTC kernels)",
                  mark("codecs.zfp.nvrtc_encode_gbs",
                       "assumed: the profile's fused kernels (Triton where it has a wheel)"),
                  _same),
            Value("torch-ops path (no NVRTC there)", "assumed: derived from the kernel count, "
                  "not measured (codecs.<name>.torch_encode_gbs)", torch_ops),
            Value("fused kernels at the profile's GB/s", "assumed: Triton-class kernels "
                  "(codecs.<name>.encode_gbs)", fused),
        ]),
        Assumption("codec GB/s (every codec)", [
            Value("as profiled, on the kernels the cluster runs", mark("codecs.zfp", "assumed"),
                  _same),
            *[Value(str(v), "assumed: a what-if", lambda c, v=v: codec_speed(c, v))
              for v in (300, 600)],
            Value("free", "assumed: the bound", lambda c: codec_speed(c, math.inf)),
        ], Knob(codec_speed, 1.0, 1e6, lambda x: f"{x:.3g} GB/s", log=True)),
        Assumption("intra-node efficiency of MPI collectives on GPU buffers", [
            Value("1.0", "assumed: the datasheet bandwidth", _same),
            Value("0.95", KHORASSANI, lambda c: efficiency("intra")(c, 0.95), best=True),
            *[Value(str(v), "assumed: a what-if", lambda c, v=v: efficiency("intra")(c, v))
              for v in (0.5, 0.25)],
        ], Knob(efficiency("intra"), 1e-3, 1.0, lambda x: f"{x:.3g}", log=True)),
        Assumption("inter-node efficiency of MPI collectives on GPU buffers", [
            Value("1.0", "assumed: the datasheet bandwidth", _same),
            Value("0.99", KHORASSANI, lambda c: efficiency("inter")(c, 0.99), best=True),
            *[Value(str(v), "assumed: a what-if", lambda c, v=v: efficiency("inter")(c, v))
              for v in (0.5, 0.25)],
        ], Knob(efficiency("inter"), 1e-3, 1.0, lambda x: f"{x:.3g}", log=True)),
        Assumption("overlap of DP reduction and ZeRO all-gather", [
            Value("0", mark("dp_overlap", "assumed"), _same),
            *[Value(str(v), "assumed: a what-if", lambda c, v=v: overlap(c, v))
              for v in (0.5, 1.0)],
        ], Knob(overlap, 0.0, 1.0, lambda x: f"{x:.3g}")),
        Assumption("achievable TFLOPS per V100", [
            Value("39", mark("achievable_tflops", "assumed"), _same),
            *[Value(str(v), "assumed: a slower baseline", lambda c, v=v: achievable(c, v))
              for v in (30, 20)],
        ], Knob(achievable, 1.0, 125.0, lambda x: f"{x:.3g}")),
        Assumption("gradient accumulation (micro batch 4)", [
            Value("32", "published: GPT-NeoX-20B's configs/20B.yml", _same),
            *[Value(str(v), "assumed: a smaller global batch",
                    lambda c, v=v: accumulation(c, v)) for v in (16, 8, 1)],
        ], Knob(accumulation, 1, 32, lambda x: f"{x:.0f}", integer=True)),
        Assumption("micro batch (global batch kept at 1536)", [
            Value("4", "published: GPT-NeoX-20B's configs/20B.yml", _same),
            *[Value(f"{mb} (accum {acc})", "assumed: a what-if",
                    lambda c, mb=mb, acc=acc: each_config(
                        c, parallel={"micro_batch": mb, "grad_accum": acc}))
              for mb, acc in ((2, 64), (1, 128))],
        ]),
        Assumption("layout", [
            Value("TP 4 x PP 4 x DP 12, 192 GPUs (ours)",
                  "assumed: ours, the largest micro batch that fits 16 GiB", _same),
            Value("TP 2 x PP 4 x DP 12, 96 GPUs", "published: GPT-NeoX-20B's configs/20B.yml",
                  layout(2, 24, 32)),
            Value("TP 2 x PP 4 x DP 24, 192 GPUs (accum 16)", "assumed: 20B.yml's TP and PP",
                  layout(2, 48, 16)),
        ]),
        # not one assumption: what several would have to be at once
        Assumption("combined: all fp32 on the wire, and", [
            Value("codecs at 300 GB/s", "assumed: a what-if",
                  combined(wire(all32), lambda c: codec_speed(c, 300))),
            Value("free codecs", "assumed: the bound",
                  combined(wire(all32), lambda c: codec_speed(c, math.inf))),
        ], Knob(lambda c, e: efficiency("inter")(codec_speed(wire(all32)(c), math.inf), e),
                1e-3, 1.0, lambda x: f"free codecs + inter-node efficiency {x:.3g}", log=True),
            combined=True),
    ]
