"""Is the builtin engine GPT-NeoX? The same weights, data, sample order and seed in both:

1. GPT-NeoX's own train.py (engine=neox, CPU mode, fp32, 1 rank, a 2-layer model, dropout
   off as neox.yml renders it) trains --steps steps and saves its initialisation
   (`extra_save_iters: [0]` -> checkpoints/global_step0);
2. GPT-NeoX's own converter (tools/ckpts/convert_neox_to_hf.py in the checkout, run through
   engines/neox/hf_export.py) turns global_step0 into an HF GPT-NeoX checkpoint;
3. the builtin engine loads it (engines/builtin/model/hf_convert.py) and trains on the samples
   GPT-NeoX trained on, in its order (GPT-NeoX's GPT2Dataset over the index maps its run
   wrote), with the same optimizer settings (studies/neox_equivalence_rank.py).

Per seed: the first step's loss of both (computed on the same initial weights) and both
curves. The seed band is the builtin engine's spread over the seeds (the loss study's
measure: mean over the second half's steps of max - min over seeds); GPT-NeoX's curve is
inside when its mean |deviation| from the same-seed builtin curve over those steps is below
the band.

    .venv/bin/python studies/neox_equivalence.py \\
        --data docs/measurements/data/<date>-neox-equivalence.runs.jsonl
    .venv/bin/python studies/neox_equivalence.py --from-data docs/measurements/data/<...>.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from neoxlab.config import to_dict
from neoxlab.config.compose import compose_experiment
from neoxlab.launch.local import mpiexec_path
from neoxlab.results import rundata
from neoxlab.results.load import read_jsonl

REPO = Path(__file__).resolve().parents[1]
# One rank, 2 layers, fp32: the shape both engines run (GPT-NeoX's dropout is 0 in neox.yml).
COMMON = ["parallel.tp=1", "parallel.pp=1", "zero=stage0", "cluster.ranks_per_node=1",
          "parallel.micro_batch=1", "parallel.grad_accum=4", "model.num_layers=2",
          "model.vocab_size=512", "train.precision=fp32", "logger.wandb=disabled"]
REL_TOL = 1e-4  # the first step's loss, relative
# The builtin engine's runs beside GPT-NeoX's: as it trains (DeepSpeed's WarmupCosineLR,
# weight decay on every parameter), with GPT-NeoX's rate per step, and with its rate and its
# weight-decay groups (no decay on biases and LayerNorms).
ROLES = {"builtin": "own", "builtin_neox_lr": "rates", "builtin_aligned": "aligned"}


def overrides(steps: int, seed: int, extra: list[str]) -> list[str]:
    return [*COMMON, f"train.steps={steps}", f"train.seed={seed}", *extra]


def neox_run(steps: int, seed: int, extra: list[str], results: Path) -> Path:
    """GPT-NeoX's train.py through our entry, saving its initial weights (global_step0)."""
    args = ["experiment=local_neox", *overrides(steps, seed, extra),
            f"train.checkpoint_every={10 * steps}", "+engine.neox_args.extra_save_iters=[0]",
            f"launch.results_dir={results}"]
    before = set(results.glob("local_neox/*"))
    proc = subprocess.run([sys.executable, "-m", "neoxlab", *args], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"GPT-NeoX run failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"\n{proc.stderr[-3000:]}")
    (run_dir,) = set(results.glob("local_neox/*")) - before
    return run_dir


def convert(run_dir: Path, checkout: Path, out: Path) -> Path:
    """global_step0 -> an HF GPT-NeoX checkpoint, by the checkout's own converter."""
    proc = subprocess.run(
        [sys.executable, "-m", "neoxlab.engines.neox.hf_export", str(checkout),
         "--input_dir", str(run_dir / "checkpoints" / "global_step0"),
         "--config_file", str(run_dir / "neox.yml"), "--output_dir", str(out),
         "--precision", "fp32", "--no_save_tokenizer"],
        cwd=checkout, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    if proc.returncode or not (out / "model.safetensors").exists():
        raise RuntimeError(f"GPT-NeoX's converter failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out


def neox_samples(run_dir: Path, checkout: Path, out: Path) -> torch.Tensor:
    """The training samples GPT-NeoX drew, in its order (read_samples), written to `out`
    (and its learning rates to out's lr.json, neox_rates) by a process of its own: GPT-NeoX's
    `megatron` package would shadow megatron-core here."""
    proc = subprocess.run([sys.executable, __file__, "--samples-of", str(run_dir),
                           "--checkout", str(checkout), "--samples-out", str(out),
                           "--rates-out", str(out.with_name("lr.json"))],
                          cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    if proc.returncode:
        raise RuntimeError(f"reading GPT-NeoX's samples failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return torch.load(out)


def read_samples(run_dir: Path, checkout: Path) -> torch.Tensor:
    """GPT-NeoX's own GPT2Dataset over the index maps (doc, sample, shuffle) its run wrote
    beside the data prefix; with one rank its sampler takes the samples consecutively,
    micro-batch after micro-batch."""
    neox = yaml.safe_load((run_dir / "neox.yml").read_text())
    sys.path.insert(0, str(checkout))
    # deferred: GPT-NeoX's package exists only in the checkout, put on sys.path just above
    from megatron.data.gpt2_dataset import GPT2Dataset

    # deferred: as above
    from megatron.data.indexed_dataset import MMapIndexedDataset

    prefix = neox["data_path"]
    batch = neox["train_micro_batch_size_per_gpu"] * neox["gradient_accumulation_steps"]
    count = neox["train_iters"] * batch
    stem = f"{prefix}_train_indexmap_{count}ns_{neox['seq_length']}sl_{neox['seed']}s"
    (doc_idx,) = Path(prefix).parent.glob(f"{Path(stem).name}_*doc_idx.npy")
    indexed = MMapIndexedDataset(prefix, skip_warmup=True)
    dataset = GPT2Dataset("train", prefix, np.arange(len(indexed.sizes)), indexed, count, None,
                          neox["seq_length"], neox["seed"], build_index_mappings=False)
    base = str(doc_idx).removesuffix("doc_idx.npy")
    for part in ("doc_idx", "sample_idx", "shuffle_idx"):
        setattr(dataset, part, np.load(base + part + ".npy", allow_pickle=True, mmap_mode="r"))
    dataset.shuffle_idx_len = dataset.shuffle_idx.shape[0] - 1
    dataset.sample_idx_len = dataset.sample_idx.shape[0] - 1
    return torch.from_numpy(np.stack([dataset[i]["text"] for i in range(count)]))


def neox_rates(run_dir: Path, checkout: Path) -> list[float]:
    """The learning rate GPT-NeoX applied at each step: its own AnnealingLR, built as its
    get_learning_rate_scheduler builds it, read before each step (the rate GPT-NeoX logs for
    step k is the one step k + 1 applies)."""
    neox = yaml.safe_load((run_dir / "neox.yml").read_text())
    sys.path.insert(0, str(checkout))
    # deferred: GPT-NeoX's package exists only in the checkout, put on sys.path just above
    from megatron.learning_rates import AnnealingLR

    decay_iters = max(1, neox["lr_decay_iters"])
    holder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    lr = neox["optimizer"]["params"]["lr"]
    scheduler = AnnealingLR(holder, start_lr=lr, warmup_iter=neox["warmup"] * decay_iters,
                            total_iters=decay_iters, decay_style=neox["lr_decay_style"],
                            last_iter=0, min_lr=neox["min_lr"],
                            use_checkpoint_lr_scheduler=False)
    rates = []
    for _ in range(neox["train_iters"]):
        rates.append(holder.param_groups[0]["lr"])
        scheduler.step()
    return rates


def builtin_run(work: Path, steps: int, seed: int, extra: list[str], samples: torch.Tensor,
                hf: Path | None, rates: list[float] | None = None,
                decay_all: bool = False) -> tuple[dict, list[dict]]:
    """The builtin engine on the same samples from `hf`'s weights (None: its own init); with
    `rates`, GPT-NeoX's rate per step (the rank program's lr.json) and its weight-decay
    groups, unless decay_all."""
    work.mkdir(parents=True, exist_ok=True)
    if rates is not None:
        (work / "lr.json").write_text(json.dumps(rates))
        if decay_all:
            (work / "decay_all").touch()
    cfg = compose_experiment("local_3d", overrides(steps, seed, extra))
    (work / "config.json").write_text(json.dumps(to_dict(cfg)))
    torch.save(samples, work / "samples.pt")
    if hf is not None and not (work / "hf").exists():
        (work / "hf").symlink_to(hf.resolve())
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=f"{REPO}:{REPO / 'src'}")
    proc = subprocess.run([mpiexec_path(), "-n", "1", sys.executable,
                           str(REPO / "studies" / "neox_equivalence_rank.py"), str(work)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"builtin run failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"\n{proc.stderr[-3000:]}")
    records, _ = read_jsonl(work / "steps.jsonl")
    return to_dict(cfg), records


def builtin_row(work: Path, cfg: dict, records: list[dict], **labels) -> dict:
    """A builtin run's row, with the keys rundata.run_row gives a run dir's."""
    return {**labels, "run_id": work.name, "run_dir": str(work),
            "config": rundata.config_of(cfg), "state": "completed",
            "steps": [r["step"] for r in records], "step_s": [r["iteration_s"] for r in records],
            "loss": [r["loss"] for r in records], "lr": [r["lr"] for r in records],
            "final_loss": records[-1]["loss"]}


def neox_row(run_dir: Path, **labels) -> dict:
    row = rundata.run_row(run_dir, **labels)
    records, _ = read_jsonl(run_dir / "metrics.jsonl")
    row["lr"] = [r.get("lr") for r in records]
    return row


def table(rows: list[dict]) -> dict:
    """Per seed and builtin variant: first-step losses and their relative difference, final
    losses, max and mean (second half) |GPT-NeoX - builtin|, the largest relative difference
    of the applied learning rates; the builtin engine's seed band over the same steps."""
    by = {(r["role"], r["seed"]): r for r in rows}
    seeds = sorted(s for role, s in by if role == "neox" and ("builtin", s) in by)
    base = np.array([by["builtin", s]["loss"] for s in seeds], dtype=float)
    n = base.shape[1]
    late = slice(n // 2, n)
    band = float(np.mean(np.ptp(base[:, late], axis=0))) if len(seeds) > 1 else None
    out = []
    for s in seeds:
        nx = np.array(by["neox", s]["loss"], dtype=float)
        # GPT-NeoX logs the rate after its scheduler stepped (the one step k + 1 applies);
        # the builtin rows hold the rate each step applied
        lr_nx = np.array(by["neox", s]["lr"], dtype=float)[:-1]
        for role in ROLES:
            if (role, s) not in by:
                continue
            bt = np.array(by[role, s]["loss"], dtype=float)
            dev = np.abs(nx - bt)
            lr_bt = np.array(by[role, s]["lr"], dtype=float)[1:]
            late_lr = slice(1, None)  # steps 3 on: the warmups differ by design (the page)
            out.append({
                "seed": s, "role": role, "first_neox": nx[0], "first_builtin": bt[0],
                "first_rel": abs(nx[0] - bt[0]) / abs(nx[0]),
                "final_neox": nx[-1], "final_builtin": bt[-1],
                "max_dev": float(dev.max()), "max_dev_step": int(dev.argmax()) + 1,
                "mean_dev_late": float(dev[late].mean()),
                "lr_max_rel": float(np.max(np.abs(lr_nx - lr_bt)[late_lr] / lr_nx[late_lr])),
                "lr_first": by[role, s]["lr"][:2],
                "inside": band is not None and float(dev[late].mean()) < band,
            })
    return {"steps": n, "band": band, "rows": out, "by": by}


def report(rows: list[dict]) -> None:
    t = table(rows)
    n, by = t["steps"], t["by"]
    band = "n/a (one seed)" if t["band"] is None else f"{t['band']:.4f}"
    print(f"| seed | builtin run | first loss GPT-NeoX | first loss builtin | relative | "
          f"final GPT-NeoX (step {n}) | final builtin | max abs dev (step) | mean abs dev "
          f"steps {n // 2 + 1}-{n} | seed band | inside | lr steps 1, 2 | lr steps 3-{n}: "
          f"max relative difference |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for r in t["rows"]:
        print(f"| {r['seed']} | {r['role']} | {r['first_neox']:.6f} | {r['first_builtin']:.6f} "
              f"| {r['first_rel']:.2e} | {r['final_neox']:.4f} | {r['final_builtin']:.4f} | "
              f"{r['max_dev']:.2e} ({r['max_dev_step']}) | {r['mean_dev_late']:.2e} | {band} | "
              f"{'yes' if r['inside'] else 'no'} | {r['lr_first'][0]:.1e}, "
              f"{r['lr_first'][1]:.1e} | {r['lr_max_rel']:.1e} |")
    neox_lr = {s: by["neox", s]["lr"][0] for s in sorted({r["seed"] for r in t["rows"]})}
    print(f"\nGPT-NeoX's rate after step 1 (the one step 2 applies), per seed: {neox_lr}; its "
          "logged rates have 4 significant digits")
    worst = max(r["first_rel"] for r in t["rows"])
    print(f"\nfirst step: worst relative difference {worst:.2e} "
          f"({'within' if worst <= REL_TOL else 'OUTSIDE'} {REL_TOL:g})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--checkout", type=Path, default=REPO / "build" / "gpt-neox")
    parser.add_argument("--results", type=Path, default=REPO / "results" / "neox_equivalence")
    parser.add_argument("--data", type=Path, help="the data file the rows go to")
    parser.add_argument("--from-data", type=Path, help="no runs: the table of a data file")
    parser.add_argument("--samples-of", type=Path, help=argparse.SUPPRESS)  # a GPT-NeoX run
    parser.add_argument("--samples-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rates-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="more overrides for both engines")
    args = parser.parse_args()
    if args.samples_of:
        torch.save(read_samples(args.samples_of, args.checkout.resolve()), args.samples_out)
        if args.rates_out:
            args.rates_out.write_text(json.dumps(neox_rates(args.samples_of,
                                                            args.checkout.resolve())))
        return 0
    if args.from_data:
        report(rundata.read(args.from_data))
        return 0
    if not args.data:
        parser.error("--data (or --from-data)")
    results, checkout = args.results.resolve(), args.checkout.resolve()
    rows = rundata.read(args.data) if args.data.exists() else []
    for seed in args.seeds:
        start = time.time()
        have = {r["role"]: r for r in rows if r["seed"] == seed}
        labels = {"seed": seed, "init": "gpt-neox global_step0", "overrides": args.overrides}
        if "neox" in have:
            run_dir = Path(have["neox"]["run_dir"])
        else:
            run_dir = neox_run(args.steps, seed, args.overrides, results)
            rundata.append(args.data, [neox_row(run_dir, role="neox", **labels)])
        hf = run_dir / "hf_step0"
        if not (hf / "model.safetensors").exists():
            convert(run_dir, checkout, hf)
        samples_pt = run_dir / "samples.pt"
        samples = (torch.load(samples_pt) if samples_pt.exists() and
                   (run_dir / "lr.json").exists() else neox_samples(run_dir, checkout,
                                                                     samples_pt))
        rates = json.loads((run_dir / "lr.json").read_text())
        for role, variant in ROLES.items():
            if role in have:
                continue
            work = results / "builtin" / f"{run_dir.name}_{role}"
            cfg, records = builtin_run(work, args.steps, seed, args.overrides, samples, hf,
                                       None if variant == "own" else rates,
                                       decay_all=variant == "rates")
            rundata.append(args.data, [builtin_row(work, cfg, records, role=role, **labels)])
        rows = rundata.read(args.data)
        print(f"seed {seed}: {run_dir} ({time.time() - start:.0f} s)", flush=True)
    report(rundata.read(args.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
