"""Temporal fusion vs its baselines, all policies side by side on one model and trace.

    python studies/flover.py [--layers 8] [--hidden 512] [--requests 32] [--gap-ms 20]
                           [--out 128 256] [--policies fused,fused_noreorder,...]

Defaults: a GPT-NeoX of 8 layers, hidden 512 (byte vocabulary 256), 32 requests with
Poisson arrivals (mean gap 20 ms), prompts of 16-32 tokens, outputs uniform in [128, 256],
greedy. hf_cb's sizing and CPU attention are searched first (hf_cb_tune.py; the trials are
printed) and the best is timed. Prints the table (TPOT and p99 latency per policy) and each
ratio against its goal (GOALS): fused vs sequential total time >= 8x, fused vs tuned hf_cb
throughput >= 1.3x (hf_cb runs a Llama twin of matched shape: transformers 5.24 cannot run
GPT-NeoX in continuous batching), fused vs fused_noreorder >= 1.2x, our sequential vs
transformers' generate on the same weights >= 1x. `cpu s` is the process CPU time, the
fairer number on a shared machine. --json writes rows, ratios and the tuning.

--data PATH (docs/measurements/data/<date>-flover.jsonl) writes a data file
(results/rundata.py): every policy's row at every gap (times, tokens, TPOT, latencies, CPU
seconds) and one row with the settings, hf_cb's search and sizing;
`python studies/flover.py --from-data PATH` prints the same tables and ratios from it alone.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from neoxlab.config import ModelConfig
from neoxlab.results import rundata
from neoxlab.serve.distributed import init_single_process
from neoxlab.serve.hf_cb import CBSizing
from neoxlab.serve.policies import POLICIES
from neoxlab.serve.runner import Runner, RunSettings, ratios
from neoxlab.serve.scheduler import Sampling
from neoxlab.serve.stats import format_table
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import WorkloadSpec, make_workload

GOALS = {"fused_vs_sequential_total_time": 8.0, "fused_vs_hf_cb_throughput": 1.3,
         "fused_vs_noreorder_total_time": 1.2, "sequential_vs_hf_generate_tokens_per_s": 1.0}


def report(rows: list[dict], tuning: list[dict], sizing: dict | None) -> None:
    """The hf_cb search, each gap's table and the ratios against their goals."""
    for gap in dict.fromkeys(r["gap_ms"] for r in rows):
        if tuning and gap == rows[0]["gap_ms"]:
            print("hf_cb search (probe tok/s):")
            for t in tuning:
                print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in t.items()))
            print(f"hf_cb timed with {sizing}")
        print(format_table([r for r in rows if r["gap_ms"] == gap]), flush=True)
    print("\nratios (fused's advantage; goal in brackets):")
    for gap, r in ratios(rows).items():
        for key, value in r.items():
            goal = f" [goal >= {GOALS[key]}]" if key in GOALS else ""
            shown = "-" if value is None else f"{value:.2f}x"
            print(f"  gap {gap} ms  {key}: {shown}{goal}")


def data_rows(args: argparse.Namespace, rows: list[dict], tuning: list[dict],
              sizing: dict | None, attention: str) -> list[dict]:
    """The --data file: a row per policy and gap, then the settings and hf_cb's search."""
    return [*({"kind": "policy", **r} for r in rows),
            {"kind": "settings", "args": {k: str(v) for k, v in vars(args).items()},
             "decode_attention": attention, "hf_cb_sizing": sizing, "hf_cb_tuning": tuning}]


def from_data(path: Path) -> None:
    data = rundata.read(path)
    (settings,) = [r for r in data if r["kind"] == "settings"]
    print(f"decode attention: {settings['decode_attention']}")
    report([{k: v for k, v in r.items() if k != "kind"} for r in data if r["kind"] == "policy"],
           settings["hf_cb_tuning"], settings["hf_cb_sizing"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--gap-ms", type=float, nargs="+", default=[20.0])
    ap.add_argument("--prompt", type=int, nargs=2, default=[16, 32])
    ap.add_argument("--out", type=int, nargs=2, default=[128, 256])
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-tune", action="store_true", help="time hf_cb untuned")
    ap.add_argument("--megatron", action="store_true", help="megatron layers, not the lean path")
    ap.add_argument("--plain-linear", action="store_true",
                    help="F.linear on the lean path, not prepacked weights (serve.packed_linear)")
    ap.add_argument("--always-packed", action="store_true",
                    help="prepacked products for every shape from min_rows() rows, untimed "
                    "(serve.packed_linear_timed=false)")
    ap.add_argument("--sdpa-attention", action="store_true",
                    help="decode attention through SDPA, not the C++ kernel "
                    "(serve.native_attention=false)")
    ap.add_argument("--json", type=Path, help="write rows, ratios and hf_cb tuning here")
    ap.add_argument("--data", type=Path, help="write every row and the settings to a data file")
    ap.add_argument("--from-data", type=Path, help="no runs: the tables of a data file")
    args = ap.parse_args()
    if args.from_data:
        from_data(args.from_data)
        return
    torch.set_num_threads(args.threads)
    max_seq = args.prompt[1] + args.out[1]
    model_cfg = ModelConfig(num_layers=args.layers, hidden_size=args.hidden,
                            num_attention_heads=args.heads, seq_length=max_seq,
                            max_position_embeddings=max_seq)
    init_single_process()
    model = build_serve_model(model_cfg, "random", 1234, 1, 0, max_seq)
    model.lean = not args.megatron
    model.use_packed_linear(not args.plain_linear, timed=not args.always_packed)
    attention = model.use_native_attention(not args.sdpa_attention)
    print(f"decode attention: {attention}")
    pages = -(-max_seq // 32) * args.requests
    settings = RunSettings(slots=args.requests, max_concurrent=args.requests,
                           max_seq_len=max_seq, window_s=0.05, sampling=Sampling(),
                           cb_sizing=CBSizing(pages, 1024, 32), repeats=args.repeats,
                           cb_tune=not args.no_tune)
    runner = Runner(model, settings)
    rows = []
    for gap in args.gap_ms:
        spec = WorkloadSpec(args.requests, "poisson", gap / 1000, tuple(args.prompt),
                            tuple(args.out), model_cfg.vocab_size, 1234)
        got, _ = runner.run_all(args.policies.split(","), make_workload(spec), gap)
        rows += got
        print(format_table(got), flush=True)
    sizing = asdict(runner.cb_sizing) if runner.cb_tuning else None
    print()
    report(rows, runner.cb_tuning, sizing)
    if args.data:
        rundata.write(args.data, data_rows(args, rows, runner.cb_tuning, sizing, attention))
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
            "ratios": ratios(rows), "decode_attention": attention,
            "hf_cb_sizing": asdict(runner.cb_sizing), "hf_cb_tuning": runner.cb_tuning}, indent=1))


if __name__ == "__main__":
    main()
