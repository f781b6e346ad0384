"""mpc's device path (the one GPUs run, forced here on CPU) holds at most twice its message in
scratch, beside its payload (encode) or its output (decode): positions are computed one
slice at a time, not as int64 arrays of the whole message."""

from __future__ import annotations

import json
import subprocess
import sys

from neoxlab.comm import memprobe
from tests.conftest import REPO_ROOT

PROBE = """
import json, torch
from neoxlab.comm import memprobe
from neoxlab.compress import make_compressor, mpc
mpc.FORCE_DEVICE_PATH = True
torch.set_num_threads(1)
c, g, out = make_compressor("mpc"), torch.Generator().manual_seed(0), {}
for dtype in (torch.float16, torch.float32):
    n = (24 << 20) // dtype.itemsize
    x = torch.cumsum(torch.randn(n, generator=g) * 1e-3, 0).to(dtype)
    payload, enc = memprobe.peak_extra_bytes(lambda: c.encode(x))
    y, dec = memprobe.peak_extra_bytes(lambda: c.decode_sized(payload, (n,), dtype))
    assert torch.equal(y.view(torch.int16 if dtype == torch.float16 else torch.int32),
                       x.view(torch.int16 if dtype == torch.float16 else torch.int32))
    out[str(dtype)] = {"message": x.nbytes, "payload": payload.numel(), "encode": enc,
                       "decode": dec}
print("PEAKS", json.dumps(out))
"""


def test_mpc_device_scratch_is_at_most_twice_the_message():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=600, cwd=REPO_ROOT, check=False,
                         env={"PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1",
                              "PATH": "/usr/bin:/bin", **memprobe.ALLOCATOR_ENV})
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("PEAKS"))
    for dtype, p in json.loads(line.split(" ", 1)[1]).items():
        assert p["encode"] - p["payload"] <= 2 * p["message"], (dtype, p)
        assert p["decode"] - p["message"] <= 2 * p["message"], (dtype, p)
