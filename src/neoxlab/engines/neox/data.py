"""The experiment's own data as a GPT-NeoX preprocessed prefix (<prefix>.bin + <prefix>.idx).

With data.source=stdlib, engine=neox trains on the same bytes as the builtin engine
(engines/builtin/data.py: the corpus files in the same order, cut at data.max_bytes), written
in GPT-NeoX's mmap format and read by its CharLevelTokenizer, whose ids are the bytes
themselves: no tokenizer download, and the same token ids as the builtin engine's byte
vocabulary. Each corpus file is one document (no end-of-document token: the builtin engine
has none either).

The prefix is built once per (corpus, max_bytes) under <results_dir>/data_cache/neox and
reused by every later run (planning writes it; `.idx` appears last, so its presence means
complete). Layout of the files, as GPT-NeoX's MMapIndexedDataset reads them:
  .bin  the tokens of every document back to back, little-endian uint16;
  .idx  b"MMIDIDX\\x00\\x00", version <Q 1, dtype code <B (8 = uint16), document count <Q,
        document-index length <Q, then sizes int32[n], byte offsets int64[n], document
        index int64[n + 1] (0, 1, ..., n: one sequence per document).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np

from neoxlab.config import Config, DataConfig
from neoxlab.engines.builtin.data import corpus_files
from neoxlab.files import atomic_path

TOKENIZER = "CharLevelTokenizer"  # GPT-NeoX's byte-level tokenizer (vocab 512, no file)
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODE = 8  # GPT-NeoX's code for uint16 (its builder's dtype below a 65500 vocabulary)
FORMAT = "neox-mmap-bytes-v1"  # changes when what is written here changes
CACHE_DIR = "data_cache/neox"


def own_data(cfg: Config) -> bool:
    """Does our pipeline write this run's data (else data.path is the user's prefix)?"""
    return cfg.data.source == "stdlib"


def cache_key(d: DataConfig) -> str:
    """What the bytes depend on: the corpus (for stdlib, this interpreter's library) and
    max_bytes; hashed into the prefix's name."""
    where = sys.prefix if d.source == "stdlib" else str(Path(str(d.path)).resolve())
    text = json.dumps([FORMAT, d.source, where, sys.version_info[:2], d.max_bytes])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def prefix_path(cfg: Config) -> Path:
    """<results_dir>/data_cache/neox/<source>-<key>_text_document (no suffix)."""
    root = Path(cfg.launch.results_dir).resolve() / CACHE_DIR
    return root / f"{cfg.data.source}-{cache_key(cfg.data)}_text_document"


def documents(d: DataConfig) -> list[bytes]:
    """The corpus files' bytes, cut at max_bytes in total: the builtin engine's bytes."""
    out, total = [], 0
    for path in corpus_files(d):
        data = path.read_bytes()[: d.max_bytes - total]
        if data:
            out.append(data)
        total += len(data)
        if total >= d.max_bytes:
            break
    return out


def index_bytes(sizes: list[int]) -> bytes:
    """The .idx of documents of these token counts (uint16 tokens)."""
    n = len(sizes)
    counts = np.asarray(sizes, dtype=np.int64)
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1] * 2, out=offsets[1:])
    head = MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", DTYPE_CODE)
    head += struct.pack("<Q", n) + struct.pack("<Q", n + 1)
    return (head + counts.astype(np.int32).tobytes() + offsets.tobytes()
            + np.arange(n + 1, dtype=np.int64).tobytes())


def write_prefix(docs: list[bytes], prefix: Path) -> None:
    """Write <prefix>.bin, then <prefix>.idx (each atomically)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(f"{prefix}.bin")) as tmp, tmp.open("wb") as out:
        for doc in docs:
            out.write(np.frombuffer(doc, dtype=np.uint8).astype("<u2").tobytes())
    with atomic_path(Path(f"{prefix}.idx")) as tmp:
        tmp.write_bytes(index_bytes([len(doc) for doc in docs]))


def read_prefix(prefix: Path) -> list[np.ndarray]:
    """The documents of a prefix (for tests and checks): one uint16 array each."""
    raw = Path(f"{prefix}.idx").read_bytes()
    if raw[:9] != MAGIC:
        raise ValueError(f"{prefix}.idx is not a GPT-NeoX mmap index (magic {raw[:9]!r})")
    n, = struct.unpack_from("<Q", raw, 18)
    sizes = np.frombuffer(raw, dtype=np.int32, count=n, offset=34)
    offsets = np.frombuffer(raw, dtype=np.int64, count=n, offset=34 + 4 * n)
    tokens = np.fromfile(f"{prefix}.bin", dtype="<u2")
    return [tokens[o // 2: o // 2 + s] for o, s in zip(offsets, sizes, strict=True)]


def ensure_prefix(cfg: Config) -> Path:
    """The run's prefix, written now if it is not cached yet."""
    prefix = prefix_path(cfg)
    if not Path(f"{prefix}.idx").is_file():
        docs = documents(cfg.data)
        if not docs:
            raise ValueError(f"data.source={cfg.data.source} gave no bytes to write to {prefix}")
        write_prefix(docs, prefix)
    return prefix
