"""engine=neox's CPU mode: what neox.yml renders on CPU vs GPU, which torch.cuda symbols the
patches change (and for whom), that a GPU cluster's ranks are never patched, the eval_batch
adapter, and the data prefix our pipeline writes. Patching runs in a child interpreter, so
this test process keeps the real torch.cuda."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from neoxlab.config.compose import compose_experiment
from neoxlab.engines.builtin.data import load_bytes
from neoxlab.engines.neox import data as neox_data
from neoxlab.engines.neox.compat import eval_batch_with_metrics
from neoxlab.engines.neox.render import CPU_OFF, render_neox_config
from neoxlab.layout import resolve_layout
from tests.conftest import REPO_ROOT

GPU = ["engine=neox", "cluster.neox_dir=/gpfs/me/gpt-neox",
       "data.path=/gpfs/me/data/pile_text_document", "data.vocab_file=/gpfs/me/tok.json"]

# A child process: inject.adapt on a run's config, then what torch.cuda answers, to a caller
# inside a module named megatron.* (GPT-NeoX's) and to one outside it.
PROBE = r"""
import json, sys, types
import torch
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox import cpu_mode, inject
from neoxlab.layout import resolve_layout
cfg = compose_experiment(sys.argv[1], sys.argv[2:])
before = torch.cuda.current_device
inject.adapt(cfg, resolve_layout(cfg))
gpt_neox = types.ModuleType("megatron.initialize")
exec("import torch\ndef ask():\n    return torch.cuda.is_available(), torch.cuda.device_count()",
     gpt_neox.__dict__)
out = {"applied": cpu_mode.applied(), "current_device_patched": torch.cuda.current_device
       is not before, "outside": [torch.cuda.is_available(), torch.cuda.device_count()],
       "megatron": list(gpt_neox.ask())}
if cpu_mode.applied():
    import deepspeed.ops.adam
    t = torch.ones(2)
    out.update(
        cuda_is_self=t.cuda(torch.cuda.current_device()) is t,
        long_tensor=str(torch.cuda.LongTensor([1, 2]).device),
        rng_equal=bool(torch.equal(torch.cuda.get_rng_state(), torch.get_rng_state())),
        no_ops=[torch.cuda.set_device(3), torch.cuda.synchronize(),
                torch.cuda.nvtx.range_push("x"), torch.cuda.nvtx.range_pop()],
        optimizer=type(deepspeed.ops.adam.FusedAdam([torch.nn.Parameter(t)], lr=0.1,
                                                    weight_decay=0.01)).__name__,
    )
from deepspeed.runtime.pipe.engine import PipelineEngine
out["eval_batch_adapted"] = getattr(PipelineEngine.eval_batch, "_neoxlab_returns_metrics", False)
print(json.dumps(out))
"""


def _probe(experiment: str, overrides: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{REPO_ROOT / 'src'}:{REPO_ROOT}", DS_ACCELERATOR="cpu",
               NEOXLAB_RANKS_PER_NODE="4")
    proc = subprocess.run([sys.executable, "-c", PROBE, experiment, *overrides], env=env,
                          capture_output=True, text=True, timeout=180, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _render(experiment: str, overrides: list[str]) -> dict:
    cfg = compose_experiment(experiment, overrides)
    return render_neox_config(cfg, resolve_layout(cfg))


def test_cpu_cluster_renders_gloo_and_every_fusion_off_gpu_keeps_nccl_and_fusions():
    cpu = _render("local_neox", [])
    assert cpu["distributed_backend"] == "gloo"
    assert all(cpu[key] is False for key in CPU_OFF)
    assert cpu["tokenizer_type"] == "CharLevelTokenizer" and "vocab_file" not in cpu
    gpu = _render("baseline_192gpu", GPU)
    assert gpu["distributed_backend"] == "nccl"
    assert gpu["bias_gelu_fusion"] is True


def test_cpu_mode_patches_torch_cuda_and_tells_only_gpt_neox_that_cuda_is_there():
    seen = _probe("local_neox", [])
    assert seen["applied"] and seen["current_device_patched"]
    assert seen["megatron"] == [True, 4]  # GPT-NeoX: present, the node's ranks
    assert seen["outside"] == [False, 0]  # torch and DeepSpeed: still a CPU machine
    assert seen["cuda_is_self"] and seen["long_tensor"] == "cpu" and seen["rng_equal"]
    assert seen["no_ops"] == [None, None, None, None]
    assert seen["optimizer"] == "AdamW"
    assert seen["eval_batch_adapted"]


def test_nothing_is_patched_on_a_gpu_cluster_but_eval_batch_is_adapted():
    seen = _probe("baseline_192gpu", GPU)
    assert not seen["applied"] and not seen["current_device_patched"]
    assert seen["megatron"] == seen["outside"] == [False, 0]  # this machine has no CUDA
    assert seen["eval_batch_adapted"]  # a DeepSpeed difference, not a CPU one


def test_eval_batch_returns_loss_and_metrics_as_gpt_neox_unpacks_it():
    class Engine:  # upstream DeepSpeed's contract: the loss, or (loss, logits) when asked
        def eval_batch(self, data_iter, return_logits=False, compute_loss=True):
            return ("loss", "logits") if return_logits else "loss"

    wrapped = eval_batch_with_metrics(Engine.eval_batch)
    loss, metrics = wrapped(Engine(), iter([]))
    assert (loss, metrics) == ("loss", {})
    assert wrapped(Engine(), iter([]), return_logits=True) == ("loss", "logits")


def test_data_prefix_holds_the_builtin_engines_bytes_as_gpt_neox_tokens(tmp_path):
    cfg = compose_experiment("local_neox", [f"launch.results_dir={tmp_path}",
                                            "data.max_bytes=50000"])
    prefix = neox_data.ensure_prefix(cfg)
    assert prefix.parent == tmp_path / "data_cache" / "neox"
    docs = neox_data.read_prefix(prefix)
    assert len(docs) > 1 and all(d.dtype == np.dtype("<u2") for d in docs)
    tokens = np.concatenate(docs)
    builtin = load_bytes(cfg.data).numpy()
    assert np.array_equal(tokens, builtin)  # the same ids, in the same order
    stamp = os.stat(f"{prefix}.bin").st_mtime_ns
    assert neox_data.ensure_prefix(cfg) == prefix  # cached: not written again
    assert os.stat(f"{prefix}.bin").st_mtime_ns == stamp
