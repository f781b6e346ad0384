"""Serve config rules, checked before anything starts; each message names the value, the
rule and the fix. `validate_serve` returns them (layout.validate collects every error);
`check_serve` raises them as one ConfigError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from neoxlab.config import Config, ConfigError
from neoxlab.serve.policies import HF_POLICIES, POLICIES
from neoxlab.serve.run_weights import validate_run_weights

ARRIVALS = ("poisson", "constant")
SAMPLING = ("greedy", "sample")


def validate_serve(cfg: Config, trains: Callable[[str], bool] | None = None) -> list[str]:
    """Every violated serve rule; empty when runnable. `trains(task name)`: the task
    registry's word on a `run:<dir>` weights' task (None: asked before planning)."""
    s, m, p = cfg.serve, cfg.model, cfg.parallel
    errors: list[str] = []
    bad = [e for e in s.policies if e not in POLICIES]
    if bad or not s.policies:
        errors.append(f"serve.policies={list(s.policies)}: {bad or 'empty'} not among "
                      f"{list(POLICIES)}; list policies from that set")
    for name in ("num_requests", "slots", "max_seq_len", "prompt_len_min", "output_len_min",
                 "hf_cb_num_blocks", "hf_cb_max_batch_tokens", "hf_cb_page_size", "repeats"):
        if getattr(s, name) < 1:
            errors.append(f"serve.{name}={getattr(s, name)} must be >= 1; use a positive integer")
    for name in ("mean_gap_ms", "batch_window_ms"):
        if getattr(s, name) < 0:
            errors.append(f"serve.{name}={getattr(s, name)} is negative: a time gap must be >= 0;"
                          " use 0 (all at once) or a positive number of ms")
    neg = [g for g in s.gaps_ms if g < 0]
    if neg:
        errors.append(f"serve.gaps_ms has negative gaps {neg}: arrival gaps must be >= 0; "
                      "remove or fix them")
    if s.gap_scale <= 0:
        errors.append(f"serve.gap_scale={s.gap_scale} must be > 0; use 1 for real milliseconds")
    if s.arrival not in ARRIVALS:
        errors.append(f"serve.arrival='{s.arrival}' is not one of {list(ARRIVALS)}")
    if s.sampling not in SAMPLING:
        errors.append(f"serve.sampling='{s.sampling}' is not one of {list(SAMPLING)}")
    if s.temperature <= 0:
        errors.append(f"serve.temperature={s.temperature} must be > 0; use greedy for argmax")
    if s.prompt_len_min > s.prompt_len_max or s.output_len_min > s.output_len_max:
        errors.append(
            f"length ranges must have min <= max: prompt [{s.prompt_len_min}, "
            f"{s.prompt_len_max}], output [{s.output_len_min}, {s.output_len_max}]; swap them")
    if s.prompt_len_max + s.output_len_max > s.max_seq_len:
        errors.append(
            f"serve.output_len_max={s.output_len_max} (max_new_tokens) + prompt_len_max="
            f"{s.prompt_len_max} exceeds serve.max_seq_len={s.max_seq_len}: each slot's KV "
            "cache holds prompt + output; raise max_seq_len or shorten prompts/outputs")
    if s.max_seq_len > m.max_position_embeddings and not s.weights.startswith("hf:"):
        errors.append(
            f"serve.max_seq_len={s.max_seq_len} > model.max_position_embeddings="
            f"{m.max_position_embeddings}; lower max_seq_len or raise the model's limit")
    concurrent = s.max_concurrent if s.max_concurrent is not None else s.slots
    if concurrent > s.slots or concurrent < 1:
        errors.append(
            f"serve.max_concurrent={concurrent} requests decoded together needs as many slots, "
            f"but serve.slots={s.slots}: every live request owns a slot; raise slots or lower "
            "max_concurrent (requests beyond it wait)")
    if s.eos_token_id is not None and not 0 <= s.eos_token_id < m.vocab_size:
        errors.append(f"serve.eos_token_id={s.eos_token_id} is outside the vocabulary "
                      f"[0, {m.vocab_size}); use a token id or null")
    if p.pp != 1:
        errors.append(f"parallel.pp={p.pp}: serve runs tensor parallelism only; set pp=1")
    world = cfg.cluster.nodes * cfg.cluster.ranks_per_node
    if world != p.tp:
        errors.append(
            f"serve runs one model replica over tp={p.tp} ranks, but the world has {world} "
            f"(cluster.nodes x ranks_per_node); set cluster.ranks_per_node={p.tp} (nodes=1)")
    hf = [e for e in s.policies if e in HF_POLICIES]
    if hf and p.tp > 1:
        errors.append(f"policies {hf} run in one process, but parallel.tp={p.tp}; drop them "
                      "from serve.policies or use tp=1")
    if not (s.weights == "random" or s.weights.startswith(("hf:", "run:"))):
        errors.append(f"serve.weights='{s.weights}' is not 'random', 'hf:<GPT-NeoX dir>' or "
                      "'run:<training run dir>'; use one of those")
    elif s.weights.startswith("run:"):
        errors += validate_run_weights(s.weights, m, trains)
    elif s.weights.startswith("hf:"):
        path = Path(s.weights.removeprefix("hf:"))
        if not (path / "config.json").exists():
            errors.append(f"serve.weights: {path} has no config.json; give a directory written "
                          "by save_pretrained of a GPTNeoXForCausalLM")
    return errors


def check_serve(cfg: Config, trains: Callable[[str], bool] | None = None) -> None:
    """Raise ConfigError listing every violated rule (nothing is started)."""
    errors = validate_serve(cfg, trains)
    if errors:
        lines = "\n".join(f"  - {e}" for e in errors)
        raise ConfigError(f"serve config of '{cfg.experiment}' is not runnable; nothing "
                          f"started:\n{lines}")
