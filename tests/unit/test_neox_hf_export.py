"""GPT-NeoX's own HF converter under our transformers (engines/neox/hf_export.py)."""

from __future__ import annotations

import sys

import pytest

from neoxlab.engines.neox import hf_export


def test_embed_out_is_the_output_layer_the_converter_writes_into():
    # deferred: transformers is slow to import; only this test needs it
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hf_export.alias_embed_out()
    model = GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, tie_word_embeddings=False))
    weight = model.lm_head.weight.detach().clone() + 1
    model.embed_out.load_state_dict({"weight": weight})  # as convert_neox_to_hf.py does
    assert model.embed_out is model.lm_head
    assert model.lm_head.weight.detach().equal(weight)


def test_a_folder_without_the_converter_is_refused_with_the_reason(tmp_path, capsys):
    assert hf_export.main([str(tmp_path), "--input_dir", "x"]) == 2
    assert "convert_neox_to_hf.py" in capsys.readouterr().err


def test_the_converter_runs_as_main_with_its_arguments(tmp_path):
    script = tmp_path / hf_export.CONVERTER
    script.parent.mkdir(parents=True)
    script.write_text("import sys, pathlib\nassert __name__ == '__main__'\n"
                      "pathlib.Path(sys.argv[2]).write_text(' '.join(sys.argv[1:]))\n")
    out = tmp_path / "args.txt"
    assert hf_export.main([str(tmp_path), "--output_dir", str(out)]) == 0
    assert out.read_text() == f"--output_dir {out}"


@pytest.fixture(autouse=True)
def _keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
