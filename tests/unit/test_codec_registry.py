"""The codec registry: a codec states its facts once, and the rest of neoxlab asks it.

The docs' codec table is the registry's; every codec's stated wire bits are what its
encoder sends; names are refused twice and unknown; outside compress/ no code compares a
codec's name (only `none`, which means "uncompressed", and config defaults remain).
"""

from __future__ import annotations

import ast
import re

import pytest
import torch

from neoxlab.compress import (
    CompressionConfigError,
    Compressor,
    available,
    make_compressor,
    registry,
)
from tests.conftest import REPO_ROOT

SRC = REPO_ROOT / "src" / "neoxlab"
EXAMPLES = [registry.codec_type(n).example() for n in available()]


def test_the_docs_codec_table_is_the_registrys():
    text = (REPO_ROOT / "docs" / "compression.md").read_text()
    head = registry.CODEC_TABLE_HEAD.splitlines()[0]
    assert head in text, "docs/compression.md lost its codec table"
    start = text.index(head)
    rows = text[start:].split("\n\n", 1)[0].strip()
    assert rows == registry.codec_table()


def test_a_duplicate_name_or_id_and_an_unknown_name_are_refused():
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.register("zfp", cid=250)(type("Again", (Compressor,), {}))
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.register("brand_new", cid=registry.codec_type("zfp").cid)(
            type("SameId", (Compressor,), {}))
    assert "brand_new" not in available()
    with pytest.raises(CompressionConfigError, match="unknown compressor 'zfq'"):
        registry.codec_type("zfq")
    with pytest.raises(CompressionConfigError, match="unknown compressor 'zfq'"):
        make_compressor("zfq:rate=8")


@pytest.mark.parametrize("spec", EXAMPLES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stated_wire_bits_are_what_the_encoder_sends(spec, dtype):
    """1 M values (the header is negligible); a codec whose size depends on the data says
    None, and one that cannot shrink the dtype sends the raw bytes."""
    c = make_compressor(spec)
    bits = c.wire_bits(dtype)
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(1)).to(dtype)
    sent = c.encode(x).numel()
    raw = x.numel() * x.element_size()
    if bits is None:
        assert c.shrinks(dtype) is None or spec.startswith("topk")
        return
    expected = x.numel() * bits / 8
    if c.shrinks(dtype) is False:
        assert bits >= 8 * x.element_size() and sent >= raw
    else:
        assert sent == pytest.approx(expected, rel=1e-3), (spec, sent, expected)


def test_fused_kernels_calibration_and_tuner_candidates_come_from_the_codecs():
    fused = registry.fused_codecs()
    assert fused and all("triton" in registry.codec_type(n).kernels for n in fused)
    for key, spec in registry.calibration_specs().items():
        assert key.split(":")[0] == make_compressor(spec).name
    cands = registry.tune_candidates()
    assert cands[0] == "none" and len(cands) == len(set(cands))
    assert {make_compressor(s).name for s in cands} <= set(available())


# a codec name compared (==, !=, in) with a string literal outside compress/ is a fact that
# belongs to the codec. `none` (uncompressed) is the one name every layer may test for;
# fp16 and bf16 are also training precisions (train.precision), compared as such
ALLOWED = {"none", "fp16", "bf16"}
# names that happen to be codec names but mean something else where they are compared
OTHER_MEANING = {
    # compression.backend=mpi: the MPI library's own algorithms and their switches
    # (MVAPICH-Plus MPIR_CVAR_COMPRESSION_ALGORITHM=zfp, MPIR_CVAR_ZFP_RATE), not our codec
    ("comm/scheme.py", "zfp"),
}


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    names = set(available()) - ALLOWED
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            consts = [side] if isinstance(side, ast.Constant) else (
                list(side.elts) if isinstance(side, ast.Tuple | ast.List | ast.Set) else [])
            for k in consts:
                if isinstance(k, ast.Constant) and isinstance(k.value, str) \
                        and re.split(r"[:(]", k.value)[0] in names:
                    hits.append((node.lineno, k.value))
    return hits


def test_no_codec_name_is_compared_outside_compress():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("compress/"):
            continue
        for line, name in _compared_names(ast.parse(path.read_text())):
            if (rel, name) not in OTHER_MEANING:
                found.append(f"{rel}:{line} compares {name!r}")
    assert not found, "ask compress.registry instead:\n" + "\n".join(found)
