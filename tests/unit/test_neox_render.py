"""neox.yml for GPT-NeoX: the published 20B values, real argument names only, YAML types."""

from __future__ import annotations

import yaml

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.render import owned_keys, render_neox_config, to_yaml
from neoxlab.engines.neox.rules import OWNED_BY
from neoxlab.layout import resolve_layout

NEOX_20B = [
    "engine=neox", "cluster.neox_dir=/gpfs/me/gpt-neox",
    "data.path=/gpfs/me/data/pile_20B_tokenizer_text_document",
    "data.vocab_file=/gpfs/me/20B_checkpoints/20B_tokenizer.json",
]

# GPT-NeoX-20B as published (EleutherAI/gpt-neox configs/20B.yml, REFERENCE.md), by hand.
PUBLISHED_20B = {
    "num_layers": 44, "hidden_size": 6144, "num_attention_heads": 64, "seq_length": 2048,
    "max_position_embeddings": 2048, "norm": "layernorm", "pos_emb": "rotary",
    "rotary_pct": 0.25, "no_weight_tying": True, "gpt_j_residual": True,
    "output_layer_parallelism": "column", "init_method": "small_init",
    "output_layer_init_method": "wang_init", "model_parallel_size": 2,
    "make_vocab_size_divisible_by": 128,
    "optimizer": {"type": "Adam", "params": {"lr": 0.97e-4, "betas": [0.9, 0.95], "eps": 1.0e-8}},
    "min_lr": 0.97e-5,
    "zero_optimization": {
        "stage": 1, "allgather_partitions": True, "allgather_bucket_size": 1260000000,
        "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 1260000000,
        "contiguous_gradients": True,
    },
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 32,
    "data_impl": "mmap", "checkpoint_activations": True, "checkpoint_num_layers": 1,
    "partition_activations": False, "synchronize_each_layer": True, "gradient_clipping": 1.0,
    "weight_decay": 0.01, "hidden_dropout": 0, "attention_dropout": 0,
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 12, "hysteresis": 2, "min_loss_scale": 1},
    "distributed_backend": "nccl", "lr_decay_style": "cosine", "warmup": 0.01,
    "wall_clock_breakdown": False, "tokenizer_type": "HFTokenizer",
    "scaled_upper_triang_masked_softmax_fusion": True, "bias_gelu_fusion": True,
}
# The published layout (TP 2 x PP 4 x DP 12 on 96 GPUs) rendered from our 20B experiment
# on 24 four-GPU nodes; what differs on purpose: steps and the V100 peak.
PUBLISHED_LAYOUT = ["cluster.nodes=24", "parallel.tp=2", "parallel.pp=4",
                    "cluster.device_memory_gib=40",  # it was trained on A100 40 GB
                    "model.make_vocab_size_divisible_by=128",  # x TP 2 = 50432
                    # compilers that build its fused softmax for torch 2.13 (C++20)
                    "cluster.modules=[cuda/12.2.2,gcc/11.2.1]"]
OURS = {"pipe_parallel_size": 4, "global_num_gpus": 96, "train_iters": 100,
        "lr_decay_iters": 100, "peak_theoretical_tflops": 125.0}

# Top-level names checked one by one in megatron/neox_arguments/neox_args.py and
# deepspeed_args.py (EleutherAI/gpt-neox at patches/upstream.lock's commit).
GPT_NEOX_ARGS = {
    "num_layers", "hidden_size", "num_attention_heads", "seq_length",
    "max_position_embeddings", "pos_emb", "rotary_pct", "rotary_emb_base", "gpt_j_residual",
    "no_weight_tying", "output_layer_parallelism", "norm", "layernorm_epsilon", "init_method",
    "output_layer_init_method", "intermediate_size", "model_parallel_size",
    "pipe_parallel_size", "make_vocab_size_divisible_by", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps", "optimizer", "min_lr", "lr_decay_style", "warmup",
    "weight_decay", "gradient_clipping", "zero_optimization", "fp16", "bf16", "data_types",
    "checkpoint_activations", "checkpoint_num_layers", "partition_activations",
    "synchronize_each_layer", "train_iters", "lr_decay_iters", "log_interval",
    "steps_per_print", "wall_clock_breakdown", "data_path", "vocab_file", "merge_file",
    "tokenizer_type", "split", "data_impl", "save", "load", "checkpoint_factor",
    "keep_last_n_checkpoints", "use_wandb", "distributed_backend", "global_num_gpus",
    "deepspeed_mpi", "deepspeed_slurm", "seed", "hidden_dropout", "attention_dropout",
    "eval_iters", "eval_interval", "peak_theoretical_tflops",
    "scaled_upper_triang_masked_softmax_fusion", "bias_gelu_fusion",
}
# DeepSpeed's ZeRO and fp16 section keys (deepspeed.ai/docs/config-json).
ZERO_KEYS = {"stage", "allgather_partitions", "allgather_bucket_size", "overlap_comm",
             "reduce_scatter", "reduce_bucket_size", "contiguous_gradients"}
FP16_KEYS = {"enabled", "loss_scale", "loss_scale_window", "hysteresis", "min_loss_scale",
             "initial_scale_power"}


def _render(experiment: str, overrides: list[str], run_dir=None) -> dict:
    cfg = compose_experiment(experiment, overrides)
    return render_neox_config(cfg, resolve_layout(cfg), run_dir)


def test_20b_matches_the_published_config_key_by_key():
    rendered = _render("baseline_192gpu", [*NEOX_20B, *PUBLISHED_LAYOUT])
    for key, expected in {**PUBLISHED_20B, **OURS}.items():
        assert rendered[key] == expected, key


def test_192_gpu_experiment_renders_its_own_layout():
    rendered = _render("hybrid_192gpu", NEOX_20B)
    assert (rendered["model_parallel_size"], rendered["pipe_parallel_size"]) == (4, 4)
    assert rendered["global_num_gpus"] == 192
    # 1536 = micro 4 x accum 32 x dp 12 at every size of the grid
    assert (rendered["train_micro_batch_size_per_gpu"],
            rendered["gradient_accumulation_steps"]) == (4, 32)


def test_every_rendered_key_is_a_gpt_neox_argument():
    rendered = _render("baseline_192gpu", [*NEOX_20B, "train.checkpoint_every=50"], "/r")
    assert set(rendered) <= GPT_NEOX_ARGS, set(rendered) - GPT_NEOX_ARGS
    assert set(rendered["zero_optimization"]) <= ZERO_KEYS
    assert set(rendered["fp16"]) <= FP16_KEYS
    bf16 = _render("baseline_192gpu", [*NEOX_20B, "train.precision=bf16"])
    assert set(bf16) <= GPT_NEOX_ARGS and "fp16" not in bf16


def test_yaml_keeps_the_types_gpt_neox_checks():
    """GPT-NeoX loads neox.yml with yaml.FullLoader and checks every value's exact type."""
    rendered = _render("baseline_192gpu", NEOX_20B, "/r")
    loaded = yaml.load(to_yaml(rendered), Loader=yaml.FullLoader)
    assert loaded == rendered
    floats = ("rotary_pct", "layernorm_epsilon", "min_lr", "warmup", "weight_decay",
              "gradient_clipping", "peak_theoretical_tflops")
    assert all(type(loaded[key]) is float for key in floats)
    ints = ("num_layers", "rotary_emb_base", "train_iters", "global_num_gpus", "seed")
    assert all(type(loaded[key]) is int for key in ints)
    assert type(loaded["optimizer"]["params"]["eps"]) is float
    assert loaded["layernorm_epsilon"] == 1e-5 and loaded["optimizer"]["params"]["eps"] == 1e-8


def test_checkpoints_go_to_the_run_dir_only_when_enabled(tmp_path):
    off = _render("baseline_192gpu", NEOX_20B, tmp_path)
    assert off["load"] == str(tmp_path / "checkpoints")
    assert "save" not in off and "checkpoint_factor" not in off  # GPT-NeoX saves at the end
    on = _render("baseline_192gpu", [*NEOX_20B, "train.checkpoint_every=25",
                                     "train.keep_checkpoints=3"], tmp_path)
    assert on["save"] == on["load"] == str(tmp_path / "checkpoints")
    assert on["checkpoint_factor"] == 25 and on["keep_last_n_checkpoints"] == 3


def test_warmup_is_the_fraction_of_steps_and_precision_follows_train():
    r = _render("baseline_192gpu", [*NEOX_20B, "train.steps=200", "train.warmup_steps=10",
                                    "train.precision=bf16"])
    assert r["warmup"] == 10 / 200 and r["train_iters"] == r["lr_decay_iters"] == 200
    assert r["bf16"] == {"enabled": True} and r["data_types"] == {"grad_accum_dtype": "fp32"}
    fp32 = _render("baseline_192gpu", [*NEOX_20B, "train.precision=fp32",
                                       "cluster.device_memory_gib=80"])
    assert "fp16" not in fp32 and "bf16" not in fp32


def test_mlp_width_and_split_follow_our_model_and_data():
    r = _render("baseline_192gpu", [*NEOX_20B, "model.ffn_mult=2", "data.val_fraction=0.01"])
    assert r["intermediate_size"] == 2 * 6144
    assert r["split"] == "990,10,0"
    assert "intermediate_size" not in _render("baseline_192gpu", NEOX_20B)  # 4h: the default


def test_engine_neox_args_change_defaults():
    r = _render("baseline_192gpu", [*NEOX_20B, "+engine.neox_args.eval_iters=10",
                                    "engine.neox_args.bias_gelu_fusion=false",
                                    "+engine.neox_args.num_workers=4"])
    assert r["eval_iters"] == 10 and r["bias_gelu_fusion"] is False and r["num_workers"] == 4


def test_every_owned_key_names_its_neoxlab_setting():
    cfg = compose_experiment("baseline_192gpu", [*NEOX_20B, "train.checkpoint_every=5",
                                                 "model.ffn_mult=2"])
    assert owned_keys(cfg, resolve_layout(cfg)) <= set(OWNED_BY)


def test_plan_writes_neox_yml_for_engine_neox_only(results_dir):
    cfg = compose_experiment("baseline_192gpu", [*NEOX_20B, f"launch.results_dir={results_dir}"])
    run_dir = plan_run(cfg, check(cfg), [], results_dir)
    assert not (run_dir / "deepspeed.json").exists()
    written = yaml.safe_load((run_dir / "neox.yml").read_text())
    assert written["num_layers"] == 44 and written["load"] == str(run_dir.resolve() / "checkpoints")
    local = compose_experiment("local_3d")
    builtin = plan_run(local, check(local), [], results_dir)
    assert (builtin / "deepspeed.json").exists() and not (builtin / "neox.yml").exists()
