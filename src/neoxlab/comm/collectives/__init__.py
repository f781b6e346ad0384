"""Compressed collectives over torch.distributed (gloo, NCCL, or any registered backend).

Each function takes the *original* torch.distributed functions (`raw`) so it never re-enters
the patch, writes its result in place and returns the cost for accounting. The ops:

- all_reduce (all_reduce.py): all-to-all of chunk payloads, owner sums, all-gather of the
  re-encoded sums; or, for small groups, one all-gather of whole payloads and a local sum;
- all_gather_into, reduce_scatter, broadcast (segmented.py): one payload per rank and
  segment; broadcast's source decodes its own payload too (replicas stay identical);
- send, recv, reduce (point.py): one payload per segment; reduce sends every payload to the
  destination, which alone decodes.

Shared parts: the cost of a call (cost.py), the payload exchange and the size tables
(exchange.py), segments, chunks and error feedback (chunks.py).

- Every op goes in segments (a quarter of the message, 1-64 MiB: neoxlab.comm_scratch), so
  its extra memory is a bounded fraction of the message (comm_scratch.op_scratch_bytes).
- Fixed-size payloads (neoxlab.comm.payload) need no size exchange and no host sync.
  Variable ones (mpc, topk) are sized on the device for the whole call first; one fixed-size
  collective exchanges that size table (on the payload's device: an NCCL group serves CUDA
  tensors only) and the host reads it once (read_sizes). That is the call's one host sync;
  the all-to-all all-reduce makes a second, as its second phase encodes sums that exist only
  after the first phase's exchange.
- No torch.cuda.synchronize(): CUDA work is timed with events, folded into the accounting
  once they have completed (neoxlab.comm.accounting).
"""

from neoxlab.comm.collectives.all_reduce import all_reduce
from neoxlab.comm.collectives.chunks import SEGMENT_ALIGN, segments
from neoxlab.comm.collectives.cost import Cost, Timed
from neoxlab.comm.collectives.point import recv, reduce, send
from neoxlab.comm.collectives.segmented import all_gather_into, broadcast, reduce_scatter

__all__ = ["SEGMENT_ALIGN", "Cost", "Timed", "all_gather_into", "all_reduce", "broadcast",
           "recv", "reduce", "reduce_scatter", "segments", "send"]
