"""The serving loop shared by our policies: admit arrived requests (one batched prompt phase
for all admitted together), then one fused decode step over a slot range, evict finished
requests, repeat.

Per-slot tokens and positions live in Python lists: the step builds its two small input
tensors from them, and the only host synchronisation per step is reading the chosen tokens
back.

Arrivals are real time: a request becomes visible at t0 + arrival_s. Under tensor
parallelism only rank 0 reads the clock and decides admissions, then broadcasts them, so all
ranks run the same steps on the same rows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from neoxlab.serve.model import ServeModel
from neoxlab.serve.policies import Policy
from neoxlab.serve.sampling import pick, request_generator
from neoxlab.serve.slots import SlotTable
from neoxlab.serve.workload import Request


class Control:
    """Rank 0 decides; `bcast` hands its decision to every TP rank (identity when alone)."""

    def __init__(self, comm: Any = None):
        self.comm = comm
        self.root = comm is None or comm.Get_rank() == 0

    def bcast(self, obj: Any) -> Any:
        return obj if self.comm is None else self.comm.bcast(obj, root=0)


@dataclass(frozen=True)
class Sampling:
    mode: str = "greedy"  # greedy | sample
    temperature: float = 1.0
    top_k: int = 0
    eos_token_id: int | None = None


@dataclass
class _Live:
    req: Request
    slot: int
    out: list[int]
    gen: torch.Generator | None
    admit_s: float
    first_s: float


@dataclass
class PolicyRun:
    """One policy's service of one trace: per-request records and step counters."""

    policy: str
    records: list[dict] = field(default_factory=list)  # one per request
    steps: int = 0  # fused decode steps
    rows: int = 0  # rows computed over all steps
    wasted_rows: int = 0  # rows of finished requests computed anyway
    moves: int = 0  # slot-to-slot cache copies of buffer reordering
    total_s: float = 0.0
    cpu_s: float = 0.0  # process CPU time: robust to other load on a shared machine
    peak_rss_bytes: int = 0
    kv_cache_bytes: int = 0


class ServeLoop:
    """Serves one trace under one of our policies (fused, ..., dynamic) on preallocated slots."""

    def __init__(self, model: ServeModel, policy: Policy, slots: int, max_seq_len: int,
                 sampling: Sampling = Sampling(), control: Control | None = None):
        self.model, self.policy, self.sampling = model, policy, sampling
        self.control = control or Control()
        self.cache = model.new_cache(slots, max_seq_len)
        self.max_seq_len = max_seq_len
        self.table = SlotTable(slots, policy.reorder)
        self.device = self.cache.k.device
        self.slot_token = [0] * slots  # the token each slot feeds at its next step
        self.slot_pos = [0] * slots  # the position it feeds it at
        self.live: dict[int, _Live] = {}  # slot -> request decoding there
        self.batch_rows = 0
        self._proc = psutil.Process()
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def check(self, requests: list[Request]) -> None:
        for r in requests:
            if len(r.prompt) + r.max_new_tokens > self.max_seq_len:
                raise ValueError(
                    f"request {r.rid}: prompt {len(r.prompt)} + max_new_tokens "
                    f"{r.max_new_tokens} exceeds the slot length max_seq_len={self.max_seq_len};"
                    " raise serve.max_seq_len or shorten the request"
                )

    def run(self, requests: list[Request]) -> PolicyRun:
        """Serve the whole trace; returns per-request records and step counters."""
        self.begin(requests)
        while self.tick():
            pass
        return self.end()

    def begin(self, requests: list[Request]) -> None:
        self.check(requests)
        self.result = PolicyRun(self.policy.name, kv_cache_bytes=self.cache.nbytes)
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.rid)))
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def tick(self) -> bool:
        """Admit what may join now, then one decode step; False once everything is served."""
        if not (self.pending or self.live):
            return False
        admit = self.control.bcast(self._decide(self.pending) if self.control.root else None)
        if admit:
            self._admit([self.pending.popleft() for _ in range(admit)], self.result)
        if self.live:
            self._step(self.result)
        rss = self._proc.memory_info().rss
        self.result.peak_rss_bytes = max(self.result.peak_rss_bytes, rss)
        return True

    def end(self) -> PolicyRun:
        result = self.result
        result.total_s = max((r["finish_s"] for r in result.records), default=0.0)
        result.cpu_s = time.process_time() - self.cpu0
        result.records.sort(key=lambda r: r["rid"])
        return result

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _room(self) -> int:
        if self.policy.batch_mode and self.live:
            return 0
        return min(self.policy.max_live - len(self.live), self.table.free())

    def _decide(self, pending: deque[Request]) -> int:
        """How many of the pending requests to admit now; sleeps while there is nothing to do."""
        while True:
            now = self.now()
            arrived = 0
            while arrived < len(pending) and pending[arrived].arrival_s <= now:
                arrived += 1
            room = self._room()
            more_coming = arrived < len(pending)
            if self.policy.window_s > 0 and not self.live and 0 < arrived < room and more_coming:
                deadline = pending[0].arrival_s + self.policy.window_s  # batching window
                if now < deadline:
                    time.sleep(max(0.0, min(deadline, pending[arrived].arrival_s) - now))
                    continue
            if arrived and room:
                return min(arrived, room)
            if self.live or not pending:
                return 0
            time.sleep(max(0.0, pending[arrived].arrival_s - now))

    def _admit(self, reqs: list[Request], result: PolicyRun) -> None:
        """Prompt phase of the requests admitted together (one forward): fill their slots'
        caches and emit each one's first token."""
        admit_s = self.now()
        slots = [self.table.assign(r.rid) for r in reqs]
        logits = self.model.prefill([r.prompt for r in reqs], slots, self.cache)
        greedy = logits.argmax(-1).tolist() if self.sampling.mode == "greedy" else None
        first_s, done = self.now(), []
        for row, (req, slot) in enumerate(zip(reqs, slots, strict=True)):
            gen = request_generator(req.seed) if greedy is None else None
            state = _Live(req, slot, [], gen, admit_s, first_s)
            token = greedy[row] if greedy is not None else self._pick(logits[row], gen)
            state.out.append(token)
            self.slot_token[slot] = token
            self.slot_pos[slot] = len(req.prompt)
            self.live[slot] = state
            if self.policy.batch_mode:
                self.batch_rows = max(self.batch_rows, slot + 1)
            if self._done(state):
                done.append(state)
        if done:
            self._finish(done, result)

    def _pick(self, logits: torch.Tensor, gen: torch.Generator | None) -> int:
        s = self.sampling
        return pick(logits, s.mode, gen, s.temperature, s.top_k)

    def _done(self, state: _Live) -> bool:
        eos = self.sampling.eos_token_id
        return len(state.out) >= state.req.max_new_tokens or (
            eos is not None and state.out[-1] == eos)

    def _rows(self) -> tuple[int, int]:
        if self.policy.batch_mode:
            return 0, self.batch_rows
        return self.table.span()

    def _step(self, result: PolicyRun) -> None:
        """One fused decode step over the row range; finished requests are evicted after."""
        lo, hi = self._rows()
        tokens = torch.tensor(self.slot_token[lo:hi], dtype=torch.long, device=self.device)
        positions = torch.tensor(self.slot_pos[lo:hi], dtype=torch.long, device=self.device)
        # rows beyond the longest live position are finished
        span = max(self.slot_pos[s] for s in self.live) + 1
        logits = self.model.decode(tokens, positions, lo, self.cache, span)
        result.steps += 1
        result.rows += hi - lo
        result.wasted_rows += hi - lo - len(self.live)
        greedy = logits.argmax(-1).tolist() if self.sampling.mode == "greedy" else None
        finished = []
        for slot, state in self.live.items():
            row = slot - lo
            token = greedy[row] if greedy is not None else self._pick(logits[row], state.gen)
            state.out.append(token)
            self.slot_token[slot] = token
            if self._done(state):
                finished.append(state)
            else:
                self.slot_pos[slot] += 1
        if finished:
            self._finish(finished, result)

    def _finish(self, states: list[_Live], result: PolicyRun) -> None:
        finish_s = self.now()
        for state in states:
            del self.live[state.slot]
            for src, dst in self.table.release(state.slot):
                self._move(src, dst)
                result.moves += 1
            result.records.append({
                "rid": state.req.rid, "arrival_s": state.req.arrival_s,
                "admit_s": state.admit_s, "first_token_s": state.first_s,
                "finish_s": finish_s, "prompt_len": len(state.req.prompt),
                "max_new_tokens": state.req.max_new_tokens, "tokens": state.out,
            })
        if self.policy.batch_mode and not self.live:
            self.batch_rows = 0

    def _move(self, src: int, dst: int) -> None:
        """Buffer reordering: a live request's cache and state move from src to dst."""
        self.cache.move(src, dst)
        self.slot_token[dst] = self.slot_token[src]
        self.slot_pos[dst] = self.slot_pos[src]
        state = self.live.pop(src)
        state.slot = dst
        self.live[dst] = state
