"""Alpha-beta time of one collective, plain or compressed as neoxlab.comm does it.

With alpha the per-message latency and B the per-rank bandwidth of the link the group
crosses (n ranks, M bytes):

  all-reduce (ring)  2(n-1) alpha + 2 (n-1)/n M / B
  all-gather         (n-1) alpha + (n-1)/n M / B        (M: the gathered output)
  p2p                alpha_p2p + M / B   (alpha_p2p: the link's p2p latency, else alpha)
  broadcast          ceil(log2 n) (alpha + M / B)       (a binomial tree)
  reduce to owners   n^2 alpha + (n-1)/n M / B + (n-1)/n M / B_full

A reduce to owners is n reduces of M/n, one to each part's owner (ZeRO-1/2's
zero.reduce_to_owner), which DeepSpeed calls one after another; gloo runs each as a ring
reduce-scatter of the part (the ring's rate, B) and a gather of its pieces to the owner, whose
link the n - 1 senders keep full, as nothing waits on a ring step (B_full:
LinkProfile.full_gbs).

Compressed (src/neoxlab/comm/collectives/): every payload is M / ratio and is preceded
by an exchange of sizes (one more latency term per phase); the all-reduce is an all-to-all
of compressed chunks, a local sum and a compressed all-gather (for n <= 2 an all-gather of
the whole compressed tensor), so it encodes M (1 + 1/n) and decodes 2M (all-gather
variant: encodes M, decodes n M). A compressed reduce to owners goes one payload at a time:
each owner receives the others' payloads of a segment in rank order, a gloo send waits for
its receiver's recv, and the owners come one after another (the next one's senders are still
waiting on the last): n(n-1) transfers a segment, (n-1) M / ratio bytes in all, each alone
on the wire and keeping it full (B_full), 2 latencies each (the recv's notice, the payload).
Codec time = bytes / throughput + calls x call cost.
A ratio <= 1 (e.g. ZFP rate 24 on fp16) sends the raw bytes but still pays the encode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neoxlab.comm_scratch import segment_bytes_for
from neoxlab.config.profile import CodecProfile, LinkProfile
from neoxlab.perfmodel.traffic import Message

SMALL_GROUP = 2  # neoxlab.comm.patch uses the all-gather all-reduce up to this group size


@dataclass(frozen=True)
class Codec:
    """A dimension's compressor as the model sees it."""

    name: str
    ratio: float  # on this message's element width; <= 1 means sent raw
    profile: CodecProfile
    min_bytes: int
    error_feedback: bool = False


@dataclass(frozen=True)
class Cost:
    comm_s: float
    codec_s: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.comm_s + other.comm_s, self.codec_s + other.codec_s)

    def scaled(self, k: float) -> Cost:
        return Cost(self.comm_s * k, self.codec_s * k)


ZERO = Cost(0.0, 0.0)


# ops whose every call moves one 1/group part of the message (the caller's tensor is a part)
PARTED_OPS = ("all_gather", "reduce_to_owners")


def wire(link: LinkProfile, steps: float, nbytes: float, p2p: bool = False,
         full: bool = False) -> float:
    """`steps` message latencies plus `nbytes` through the rank's share of the link (full:
    at the rate of transfers that keep it full)."""
    alpha = link.p2p_latency_us if p2p and link.p2p_latency_us is not None else link.latency_us
    gbs = link.full_gbs if full and link.full_gbs is not None else link.bandwidth_gbs
    return steps * alpha * 1e-6 + nbytes / (gbs * 1e9)


def plain(msg: Message, link: LinkProfile) -> float:
    n, m = msg.group, msg.nbytes
    if msg.op == "all_reduce":
        return wire(link, 2 * (n - 1), 2 * (n - 1) / n * m)
    if msg.op == "reduce_to_owners":  # per part: n-1 ring steps, then the gather
        return wire(link, n * (n - 1), (n - 1) / n * m) + wire(link, n, (n - 1) / n * m,
                                                               full=True)
    if msg.op == "all_gather":
        return wire(link, n - 1, (n - 1) / n * m)
    if msg.op == "broadcast":
        rounds = math.ceil(math.log2(n))
        return wire(link, rounds, rounds * m)
    return wire(link, 1, m, p2p=True)


def codec_time(p: CodecProfile, enc_bytes: float, enc_calls: float, dec_bytes: float,
               dec_calls: float) -> float:
    return (enc_bytes / (p.encode_gbs * 1e9) + dec_bytes / (p.decode_gbs * 1e9)
            + (enc_calls + dec_calls) * p.call_us * 1e-6)


def compressed(msg: Message, link: LinkProfile, codec: Codec) -> Cost:
    n, m = msg.group, msg.nbytes
    sent_raw = codec.ratio <= 1.0
    r = 1.0 if sent_raw else codec.ratio
    p = codec.profile
    if msg.op == "all_reduce" and n <= SMALL_GROUP:
        comm = wire(link, 2 * (n - 1), (n - 1) * m / r)
        enc, enc_calls, dec, dec_calls = m, 1, n * m, n
    elif msg.op == "all_reduce":
        comm = wire(link, 4 * (n - 1), 2 * (n - 1) / n * m / r)
        enc, enc_calls, dec, dec_calls = m * (1 + 1 / n), n + 1, 2 * m, 2 * n
    elif msg.op == "all_gather":
        comm = wire(link, 2 * (n - 1), (n - 1) / n * m / r)
        enc, enc_calls, dec, dec_calls = m / n, 1, m, n
    elif msg.op == "reduce_to_owners":  # n reduces of m/n: send n-1 parts, decode own n
        part = int(m / n)
        transfers = n * (n - 1) * math.ceil(part / segment_bytes_for(part))
        comm = wire(link, 2 * transfers, (n - 1) * m / r, p2p=True, full=True)
        enc, enc_calls, dec, dec_calls = m, n, m, n
    else:  # p2p: size, then payload
        comm = wire(link, 2, m / r, p2p=True)
        enc, enc_calls, dec, dec_calls = m, 1, m, 1
    if codec.error_feedback:  # the residual needs the decoded message too
        dec, dec_calls = dec + m, dec_calls + 1
    if sent_raw:  # raw passthrough: nothing to decode
        dec, dec_calls = 0.0, 0
    return Cost(comm, codec_time(p, enc, enc_calls, dec, dec_calls))


def compresses(msg: Message, codec: Codec | None) -> bool:
    """The dimension has a codec and the message is big enough for it (the patch compares
    the caller's tensor, a part for all-gathers and reduces to owners, with min_bytes)."""
    shard = msg.nbytes / msg.group if msg.op in PARTED_OPS else msg.nbytes
    return codec is not None and shard >= codec.min_bytes


def message_cost(msg: Message, link: LinkProfile, codec: Codec | None) -> Cost:
    """One call; compressed only where compresses() says so."""
    if not compresses(msg, codec):
        return Cost(plain(msg, link), 0.0)
    return compressed(msg, link, codec)
