"""Bad serve input is rejected before anything starts, with the value, the rule and a fix."""

from __future__ import annotations

import pytest

from neoxlab.commands.check import problems
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.serve import check_serve, validate_serve


def _cfg(*overrides: str):
    return compose_experiment("flover_poisson", list(overrides))


@pytest.mark.parametrize("name", ["flover_poisson", "flover_sweep", "flover_tp2"])
def test_shipped_serve_experiments_are_valid(name):
    assert validate_serve(compose_experiment(name, [])) == []


def test_max_new_tokens_beyond_max_seq_len_is_rejected():
    (error,) = validate_serve(_cfg("serve.output_len_max=200", "serve.max_seq_len=128"))
    assert "output_len_max=200" in error and "max_seq_len=128" in error
    assert "raise max_seq_len" in error


def test_more_concurrent_requests_than_slots_is_rejected():
    (error,) = validate_serve(_cfg("serve.max_concurrent=40", "serve.slots=32"))
    assert "max_concurrent=40" in error and "slots=32" in error and "raise slots" in error


def test_negative_gaps_are_rejected():
    errors = validate_serve(_cfg("serve.mean_gap_ms=-5", "serve.gaps_ms=[20,-1]"))
    assert len(errors) == 2
    assert any("mean_gap_ms=-5" in e for e in errors)
    assert any("[-1.0]" in e for e in errors)
    assert all(">= 0" in e for e in errors)


def test_every_problem_is_reported_at_once_and_check_raises():
    cfg = _cfg("serve.policies=[fused,warp,hf_cb]", "parallel.tp=2", "serve.weights=somewhere")
    errors = validate_serve(cfg)
    assert any("warp" in e for e in errors)
    assert any("ranks_per_node=2" in e for e in errors)  # world 1 != tp 2
    assert any("hf_cb" in e and "tp=2" in e for e in errors)
    assert any("somewhere" in e for e in errors)
    with pytest.raises(ConfigError, match="nothing started"):
        check_serve(cfg)


def test_training_configs_are_not_judged_by_serve_rules():
    """Serve's rules are the serve task's record's: a training run's check never asks them."""
    cfg = compose_experiment("local_3d", ["serve.slots=0"])
    assert problems(cfg) == []


def test_zero_repeats_is_rejected():
    (error,) = validate_serve(_cfg("serve.repeats=0"))
    assert "serve.repeats=0 must be >= 1" in error


def test_the_old_serve_engines_key_names_its_new_name():
    """serve.engines became serve.policies ("engine" is the training engine); the old key,
    as an override or in a config, gets an error that names the new one."""
    from neoxlab.config import to_structured

    with pytest.raises(ConfigError, match="'serve.engines' was renamed 'serve.policies'"):
        _cfg("serve.engines=[fused]")
    with pytest.raises(ConfigError, match="'serve.engines' was renamed 'serve.policies'"):
        to_structured({"serve": {"engines": ["fused"]}})
    assert _cfg("serve.policies=[fused]").serve.policies == ["fused"]


@pytest.mark.parametrize("key", ["serve.compile_decode", "serve.prefill_chunk"])
def test_a_removed_serve_key_is_refused_with_its_reason(key):
    """Switches that did not pay were removed; setting one says so and why."""
    from neoxlab.config import to_structured

    section, name = key.split(".")
    with pytest.raises(ConfigError, match=rf"'{key}' was removed: .+ \(fused .+\); delete it"):
        _cfg(f"{key}=1")
    with pytest.raises(ConfigError, match=f"'{key}' was removed"):
        to_structured({section: {name: 1}})


def test_older_stored_configs_load_with_renamed_and_removed_keys():
    """A run dir's config.json holds every field of its day: serve.engines (now
    serve.policies), serve.compile_decode and serve.prefill_chunk still load."""
    from neoxlab.config import from_dict, to_dict

    stored = to_dict(_cfg("serve.policies=[fused,static]"))
    stored["serve"]["engines"] = stored["serve"].pop("policies")
    stored["serve"].update(compile_decode=False, prefill_chunk=0)
    cfg = from_dict(stored)
    assert cfg.serve.policies == ["fused", "static"]
    assert cfg.model == _cfg().model
    assert "engines" in stored["serve"]  # the caller's dict is left as it was


def test_repeats_keep_the_run_with_the_median_total_time(monkeypatch):
    """Two policies, three rounds after their solo warm-ups, in turn: fused's runs take 3, 1,
    9 s and static's 4, 6, 5 s; the medians (3, 5) are reported with the spread."""
    from neoxlab.serve import runner
    from neoxlab.serve.scheduler import PolicyRun, Sampling
    from neoxlab.serve.workload import Request

    order = iter([("fused", 0.5), ("static", 0.4), ("fused", 3.0), ("static", 4.0),
                  ("fused", 1.0), ("static", 6.0), ("fused", 9.0), ("static", 5.0)])
    served = []

    class FakeLoop:
        def __init__(self, model, policy, *args, **kwargs):
            self.name = policy.name

        def run(self, requests):
            name, total = next(order)
            assert name == self.name  # warm-ups first, then rounds of every policy in turn
            served.append([r.rid for r in requests])
            rec = {"rid": 0, "arrival_s": 0.0, "admit_s": 0.0, "first_token_s": total / 2,
                   "finish_s": total, "prompt_len": 2, "max_new_tokens": 3, "tokens": [1, 2, 3]}
            return PolicyRun(name, records=[rec], total_s=total, cpu_s=total)

    monkeypatch.setattr(runner, "ServeLoop", FakeLoop)
    settings = runner.RunSettings(slots=2, max_concurrent=2, max_seq_len=16, window_s=0.0,
                                  sampling=Sampling(), cb_sizing=None, repeats=3)
    requests = [Request(0, 0.0, [1, 2], 3, 0)]
    got = runner.Runner(model=None, settings=settings).run_policies(["fused", "static"],
                                                                    requests)
    fused, static = got["fused"][1], got["static"][1]
    assert (fused["total_s"], fused["total_s_min"], fused["total_s_max"]) == (3.0, 1.0, 9.0)
    assert (static["total_s"], static["total_s_min"], static["total_s_max"]) == (5.0, 4.0, 6.0)
    assert fused["repeats"] == static["repeats"] == 3
    assert served == [[0]] * 8
