"""The sharded model (TP=2, PP=2) computes the same loss as transformers' GPTNeoX."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from neoxlab.config import to_dict
from neoxlab.config.compose import compose_experiment
from neoxlab.launch.local import mpiexec_path
from tests.conftest import REPO_ROOT

REL_TOL = 1e-5  # fp32 on both sides; only summation order differs


def hf_model(cfg):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    m = cfg.model
    hf_cfg = GPTNeoXConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, intermediate_size=m.ffn_mult * m.hidden_size,
        rotary_pct=m.rotary_pct, rotary_emb_base=m.rotary_emb_base,
        max_position_embeddings=m.max_position_embeddings, use_parallel_residual=True,
        hidden_act="gelu", layer_norm_eps=m.layernorm_eps, attention_dropout=0.0,
        hidden_dropout=0.0, tie_word_embeddings=False, attn_implementation="eager",
    )
    torch.manual_seed(7)
    model = GPTNeoXForCausalLM(hf_cfg).float().eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values, so every term matters
        for name, p in model.named_parameters():
            if "layernorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def test_tp2_pp2_loss_matches_transformers(tmp_path):
    cfg = compose_experiment(
        "local_3d",
        ["cluster.ranks_per_node=4", "parallel.micro_batch=2", "parallel.grad_accum=1",
         "model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
         "model.rotary_pct=0.5", "zero.stage=0"],
    )
    assert cfg.model.parallel_residual and cfg.model.rotary_pct < 1
    model = hf_model(cfg)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length + 1),
                           generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    ).item()

    (tmp_path / "config.json").write_text(json.dumps(to_dict(cfg)))
    torch.save(model.state_dict(), tmp_path / "hf_state.pt")
    torch.save(tokens, tmp_path / "tokens.pt")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=f"{REPO_ROOT}:{REPO_ROOT / 'src'}")
    proc = subprocess.run(
        [mpiexec_path(), "-n", "4", sys.executable, str(REPO_ROOT / "tests/integration/hf_rank.py"),
         str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loss = json.loads((tmp_path / "loss.json").read_text())["loss"]
    assert abs(loss - expected) / abs(expected) <= REL_TOL, (loss, expected)
