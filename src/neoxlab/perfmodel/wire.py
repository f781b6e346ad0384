"""From the comm accounting to bytes on a wire, and from interface counters to payload:
the two sides of the check that the emulated links carried what the accounting says.
"""

from __future__ import annotations

# TCP over IPv4 on Ethernet, per packet: 14 (Ethernet) + 20 (IP) + 20 (TCP) + 12 (the
# timestamp option Linux sets by default) bytes of headers around the payload
HEADER_BYTES = 14 + 20 + 20 + 12


def payload_bytes(counter: dict[str, int], direction: str = "tx") -> int:
    """Bytes of TCP payload in an interface's counters (headers of every packet removed;
    pure ACKs carry none)."""
    return counter[f"{direction}_bytes"] - HEADER_BYTES * counter[f"{direction}_packets"]


def sent_factor(op: str, group_size: int) -> float:
    """Bytes one rank sends to the other ranks of its group per byte it accounts for a call
    (bytes_out): a ring all-reduce sends 2(n-1)/n of the message, an all-gather sends the
    rank's part to each of the n-1 others, a broadcast sends the message n-1 times in all
    (accounted on all n ranks), a send once (accounted on both ends)."""
    n = group_size
    if n < 2:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "all_gather_into_tensor"):
        return float(n - 1)
    if op in ("reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
              "reduce"):
        return (n - 1) / n
    if op in ("send", "recv", "isend", "irecv"):
        return 0.5
    raise ValueError(f"no wire model for op '{op}'")


def crossing_fraction(ranks: list[int], node_of) -> float:
    """The share of a group's traffic that leaves a node: all of it for a pair on two nodes,
    none inside one node; for larger groups the share of the hops of a ring in rank order
    (gloo's) that join two nodes."""
    n = len(ranks)
    if n < 2:
        return 0.0
    hops = sum(node_of(ranks[i]) != node_of(ranks[(i + 1) % n]) for i in range(n))
    return 1.0 if n == 2 and hops else hops / n


def accounted_between_nodes(group_rows: list[dict], node_of) -> float:
    """Bytes all ranks sent to other nodes, by the accounting (comm_groups.jsonl rows)."""
    return sum(
        row["bytes_out"] * sent_factor(row["op"], len(row["ranks"]))
        * crossing_fraction(row["ranks"], node_of)
        for row in group_rows
    )
