"""Raw collectives of one process playing rank 0 of a group whose peers send what it sends.

Only the wire is simulated: every buffer the compressed collectives allocate is real, so
their memory and host syncs can be measured on one device (bench/device/op_memory.py,
bench/device/sync_check.py). The copies are device to device and allocate nothing.
"""

from __future__ import annotations


class LoopbackRaw:
    """torch.distributed's raw collectives for rank 0 of n ranks: peer j's slot for rank 0
    is its slot 0, i.e. this rank's own. Point to point, every peer sends what this rank
    sent: recv(src) replays the messages send() recorded, in order, from src's own place
    in them (so a variable-size codec's size table and payloads arrive valid); before
    anything was sent, received messages are zeros (valid for fixed-rate codecs)."""

    def __init__(self, n: int):
        self.n = n
        self.sent: list = []  # what send() was given, in order
        self.cursor: dict[int, int] = {}  # per source: the next message of `sent` it replays
        self.recording = True

    def all_to_all_single(self, out, inp, output_split_sizes=None, input_split_sizes=None,
                          group=None):
        k = input_split_sizes[0] if input_split_sizes else inp.numel() // self.n
        for j in range(self.n):
            out[j * k: (j + 1) * k].copy_(inp[:k])

    def all_gather_into_tensor(self, out, inp, group=None):
        k = inp.numel()
        for j in range(self.n):
            out[j * k: (j + 1) * k].copy_(inp)

    def broadcast(self, tensor, src, group=None):
        pass

    def send(self, tensor, dst, group=None):
        if self.recording:
            self.sent.append(tensor.clone())

    def recv(self, tensor, src, group=None):
        if not self.sent:
            tensor.zero_()
            return
        at = self.cursor.get(src, 0)
        tensor.copy_(self.sent[at % len(self.sent)][: tensor.numel()])
        self.cursor[src] = at + 1
