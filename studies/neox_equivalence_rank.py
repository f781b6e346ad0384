"""The builtin engine's side of studies/neox_equivalence.py: one rank (mpiexec -n 1) trains
the builtin model on given samples in the given order, from given HF weights.

<work> holds config.json (a builtin Config), samples.pt (int64 [n, seq_length + 1], in the
order GPT-NeoX consumed them) and, unless the model keeps its own initialisation, hf/ (an HF
GPT-NeoX checkpoint: GPT-NeoX's initial weights through its own converter). With lr.json
(the rate GPT-NeoX applied at each step) the two optimizer details where the engines differ
take GPT-NeoX's side: that rate each step instead of DeepSpeed's WarmupCosineLR, and no
weight decay on biases and LayerNorms (GPT-NeoX's parameter groups; with a file decay_all
as well, the builtin engine's decay on every parameter). Writes
<work>/steps.jsonl: per step its loss, learning rate and seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import deepspeed
import torch
from safetensors.torch import load_file

from neoxlab.config import Config, from_dict
from neoxlab.engines.builtin.deepspeed_config import render
from neoxlab.engines.builtin.model.hf_convert import load_into_pipeline
from neoxlab.engines.builtin.model.pipe import build_pipeline_model
from neoxlab.engines.builtin.program import build_engine, init_distributed
from neoxlab.layout import padded_vocab_size, resolve_layout
from neoxlab.run import dist


def main(work: Path) -> None:
    cfg = from_dict(json.loads((work / "config.json").read_text()))
    dist.discover()
    torch.manual_seed(cfg.train.seed)
    torch.set_num_threads(cfg.engine.torch_threads)
    layout = resolve_layout(cfg)
    if layout.world_size != 1:
        raise SystemExit(f"one rank only (the samples are GPT-NeoX's DP=1 order), got {layout}")
    topology = init_distributed(cfg, layout)
    rates = json.loads((work / "lr.json").read_text()) if (work / "lr.json").exists() else None
    if rates is None:
        engine = build_engine(cfg, layout, topology, render(cfg, layout))
    else:
        engine = neox_optimizer_engine(cfg, layout, topology,
                                       decay_all=(work / "decay_all").exists())
    hf = work / "hf" / "model.safetensors"
    if hf.exists():
        load_into_pipeline(engine.module, load_file(hf), cfg.model, 0, 1,
                           padded_vocab_size(cfg.model, 1))
    samples = torch.load(work / "samples.pt")
    batch, micro = layout.global_batch, layout.micro_batch
    with open(work / "steps.jsonl", "w") as out:
        for step in range(1, cfg.train.steps + 1):
            chunk = samples[(step - 1) * batch: step * batch]
            micro_batches = iter([(m[:, :-1].contiguous(), m[:, 1:].contiguous())
                                  for m in chunk.split(micro)])
            if rates is not None:
                for group in engine.optimizer.param_groups:
                    group["lr"] = rates[step - 1]
            lr = engine.get_lr()[0]
            start = time.perf_counter()
            loss = engine.train_batch(data_iter=micro_batches)
            out.write(json.dumps({"step": step, "loss": float(loss), "lr": lr,
                                  "iteration_s": time.perf_counter() - start}) + "\n")
            out.flush()
    torch.distributed.barrier()


def neox_optimizer_engine(cfg: Config, layout, topology, decay_all: bool = False):
    """The builtin model under GPT-NeoX's optimizer groups: AdamW with weight decay on every
    parameter but biases and LayerNorms (decay_all: on every one, as the builtin engine);
    no scheduler (main sets each step's rate)."""
    t = cfg.train
    model = build_pipeline_model(cfg.model, topology, t.seed,
                                 cfg.parallel.activation_checkpointing,
                                 cfg.parallel.partition_method)
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            plain = decay_all or (name != "bias" and not isinstance(module, torch.nn.LayerNorm))
            (decay if plain else no_decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=t.lr,
        betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay)
    ds = {k: v for k, v in render(cfg, layout).items() if k not in ("optimizer", "scheduler")}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
    return engine


if __name__ == "__main__":
    main(Path(sys.argv[1]))
