"""Run the checkout's own GPT-NeoX -> HF converter (tools/ckpts/convert_neox_to_hf.py) under
the transformers we pin.

The converter is written for transformers 4.38 (GPT-NeoX's requirements), where
`GPTNeoXForCausalLM` names its output layer `embed_out`; transformers 5 names it `lm_head`,
so the converter stops with `AttributeError: ... no attribute 'embed_out'` after converting
every other tensor. As with CPU mode, nothing in the checkout is edited: `embed_out` becomes
an alias of `lm_head` in this process, then the script runs unchanged as `__main__`.

    python -m neoxlab.engines.neox.hf_export <checkout> --input_dir <ckpt>/global_step0 \\
        --config_file <run_dir>/neox.yml --output_dir <hf_dir> --no_save_tokenizer
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

CONVERTER = Path("tools") / "ckpts" / "convert_neox_to_hf.py"


def alias_embed_out() -> None:
    """GPTNeoXForCausalLM.embed_out -> lm_head, where transformers has no embed_out."""
    # deferred: transformers is slow to import; only the converter's process needs it
    from transformers import GPTNeoXForCausalLM

    if not hasattr(GPTNeoXForCausalLM, "embed_out"):
        GPTNeoXForCausalLM.embed_out = property(lambda self: self.lm_head)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    checkout, args = Path(argv[0]).resolve(), argv[1:]
    script = checkout / CONVERTER
    if not script.is_file():
        print(f"no {CONVERTER} in {checkout}: cluster.neox_dir must be a GPT-NeoX checkout",
              file=sys.stderr)
        return 2
    alias_embed_out()
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
