"""Rank program for the transformers-equivalence test: load HF weights, evaluate one batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from neoxlab.config import from_dict
from neoxlab.engines.builtin.deepspeed_config import render
from neoxlab.engines.builtin.model.hf_convert import load_into_pipeline
from neoxlab.engines.builtin.program import build_engine, init_distributed
from neoxlab.layout import padded_vocab_size, resolve_layout
from neoxlab.run import dist


def main(work: Path) -> None:
    cfg = from_dict(json.loads((work / "config.json").read_text()))
    info = dist.discover()
    layout = resolve_layout(cfg)
    topology = init_distributed(cfg, layout)
    engine = build_engine(cfg, layout, topology, render(cfg, layout))
    tp_rank = topology.get_coord(info.rank).model
    hf = torch.load(work / "hf_state.pt")
    vocab = padded_vocab_size(cfg.model, layout.tp)
    load_into_pipeline(engine.module, hf, cfg.model, tp_rank, layout.tp, vocab)
    tokens = torch.load(work / "tokens.pt")
    batch = iter([(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())])
    loss = engine.eval_batch(batch)
    if info.rank == 0:
        (work / "loss.json").write_text(json.dumps({"loss": float(loss)}))
    torch.distributed.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
