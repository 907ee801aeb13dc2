"""Continuous batching in engine steps, the way vLLM's V1 scheduler does it, with no notion of time
source: the live engine drives it on the wall clock, the ground-truth calculator in virtual time.

Per step: running requests first (one decode token each, or their next prefill chunk), then waiting
requests in arrival order while the token budget, `max_num_seqs` and free KV blocks allow (chunked
prefill). When a running request needs a KV block and none is free, the newest running request is
preempted: its blocks are freed and it goes back to the front of the queue to be recomputed.
P/D decode instances hold requests whose KV is in flight ("deferred") until the transfer ends.

Prefix caching as vLLM V1 does it: a request carries the chained hashes of its prompt's full blocks
(`prompt_block_hashes`); once its prefill is done those blocks stay in the cache under their hash. A
new request takes the longest run of its leading hashes found there (at most the prompt minus one
token, which must be computed to sample) and starts its prefill after them. Blocks nobody references
are free but keep their contents until they are needed: they are evicted least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from crossover.sim.model import PerfModel, StepLoad, prefill_attention_pairs


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside an instance; times are in the driver's clock (wall or virtual seconds)."""

    request_id: str
    prompt_tokens: int
    output_tokens: int  # tokens to emit before finishing
    arrival: float
    finish_reason: str = "length"  # reported when output_tokens are reached
    remote_kv: bool = False  # P/D decode: the prompt's KV arrives over the KV link
    prefill_target: int = 0  # tokens whose KV must be computed before the next sample
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    prev_token_time: float | None = None
    kv_ready_time: float | None = None
    kv_transfer_s: float = 0.0
    preemptions: int = 0
    finished: bool = False
    sink: Any = None  # whoever waits for this request's tokens (the HTTP handler, the DES client)
    pending: bytes = b""  # the live server's next chunk, formatted while the step runs
    block_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's full blocks (prefix caching)
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    held: list[int] = field(default_factory=list)  # hashes of the cached blocks this request references

    def __post_init__(self) -> None:
        if not self.prefill_target:
            self.prefill_target = self.prompt_tokens


@dataclass(slots=True)
class StepPlan:
    work: list[tuple[SimRequest, int]]  # (request, tokens computed this step)
    load: StepLoad
    seconds: float


@dataclass(slots=True)
class StepOutcome:
    emitted: list[SimRequest] = field(default_factory=list)  # one token each, at the step's end
    finished: list[SimRequest] = field(default_factory=list)


class Scheduler:
    """The state of one instance's engine: queues, KV blocks and the step planner."""

    def __init__(self, model: PerfModel) -> None:
        self.model = model
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.transferring: list[SimRequest] = []  # P/D decode: KV in flight (waiting reason "deferred")
        self.free_blocks = model.kv_capacity_blocks  # referenced by no request (empty or evictable)
        self.preemptions = 0
        self.cache_refs: dict[int, int] = {}  # block hash -> requests referencing it
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first

    # --- queue state, read by /metrics -------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.transferring)

    @property
    def kv_usage(self) -> float:
        total = self.model.kv_capacity_blocks
        return 0.0 if total == 0 else 1.0 - self.free_blocks / total

    def next_kv_ready(self) -> float | None:
        return min((r.kv_ready_time for r in self.transferring if r.kv_ready_time is not None), default=None)

    # --- changes -------------------------------------------------------------------------------
    def add(self, request: SimRequest) -> None:
        model = self.model
        if model.blocks_for(request.prompt_tokens + request.output_tokens) > model.kv_capacity_blocks:
            raise ValueError(f"request {request.request_id} needs more KV than the instance has")
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """Remove a request wherever it is (client gone, connection dropped)."""
        if request.finished:
            return
        request.finished = True
        self._release(request)
        if request in self.running:
            self.running.remove(request)
        elif request in self.transferring:
            self.transferring.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def _release(self, request: SimRequest) -> None:
        self.free_blocks += request.blocks - len(request.held)
        # A request's last blocks are the least likely to be shared: they go first (as vLLM frees).
        for block_hash in reversed(request.held):
            refs = self.cache_refs[block_hash] - 1
            self.cache_refs[block_hash] = refs
            if refs == 0:
                self.evictable[block_hash] = None
                self.free_blocks += 1
        request.held = []
        request.blocks = 0

    def _take(self, need: int) -> None:
        """Allocate `need` free blocks, evicting the oldest unreferenced cached ones if empty ones run out."""
        for _ in range(need - (self.free_blocks - len(self.evictable))):
            block_hash, _ = self.evictable.popitem(last=False)
            del self.cache_refs[block_hash]
        self.free_blocks -= need

    def _reuse_prefix(self, request: SimRequest) -> None:
        """Admission: reference the blocks of the prompt's longest cached prefix; skip their prefill."""
        usable = (request.prompt_tokens - 1) // self.model.block_size
        for block_hash in request.block_hashes[:usable]:
            refs = self.cache_refs.get(block_hash)
            if refs is None:
                break
            if refs == 0:
                del self.evictable[block_hash]
                self.free_blocks -= 1
            self.cache_refs[block_hash] = refs + 1
            request.held.append(block_hash)
            request.blocks += 1
        request.computed = request.blocks * self.model.block_size
        if request.preemptions == 0:
            request.cached_tokens = request.computed

    def _cache_prompt(self, request: SimRequest) -> None:
        """Prefill done: the prompt's full blocks this request computed join the cache under their hash."""
        for block_hash in request.block_hashes[len(request.held):]:
            if block_hash in self.cache_refs:  # computed twice at once: the first copy stays cached
                break
            self.cache_refs[block_hash] = 1
            request.held.append(block_hash)

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self._release(victim)
        # Recompute: the prompt and everything generated so far are prefilled again.
        victim.prefill_target = victim.prompt_tokens + victim.generated
        victim.computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _grow(self, request: SimRequest, tokens: int) -> bool:
        need = self.model.blocks_for(request.computed + tokens) - request.blocks
        if need > self.free_blocks:
            return False
        if need > 0:
            self._take(need)
            request.blocks += need
        return True

    def plan(self, now: float) -> StepPlan | None:
        """Pick this step's work; None when nothing can run now (idle, or only KV in flight)."""
        model = self.model
        arrived = [r for r in self.transferring if r.kv_ready_time is not None and r.kv_ready_time <= now]
        for request in arrived:
            self.transferring.remove(request)
            self.running.append(request)
        budget = model.max_num_batched_tokens
        block = model.block_size
        running = self.running
        work: list[tuple[SimRequest, int]] = []
        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            remaining = request.prefill_target - request.computed
            tokens = (remaining if remaining < budget else budget) if remaining > 0 else 1
            need = -(-(request.computed + tokens) // block) - request.blocks
            if need > self.free_blocks:
                # Out of KV: preempt from the newest end. Requests already planned this step sit
                # before `index`, so the victim is never one of them (at worst it is this request).
                preempted_itself = False
                while not self._grow(request, tokens):
                    victim = running[-1]
                    self._preempt(victim)
                    if victim is request:
                        preempted_itself = True
                        break
                if preempted_itself:
                    continue
            elif need > 0:
                self._take(need)
                request.blocks += need
            work.append((request, tokens))
            budget -= tokens
            index += 1
        while self.waiting and budget > 0 and len(self.running) + len(self.transferring) < model.max_num_seqs:
            request = self.waiting[0]
            if request.remote_kv and request.computed == 0 and request.generated == 0:
                # P/D decode: allocate the prompt's blocks, then wait for the KV link.
                if not self._grow(request, request.prompt_tokens):
                    break
                self.waiting.popleft()
                request.computed = request.prompt_tokens - 1  # the last prompt token is recomputed
                request.kv_transfer_s = model.kv_transfer_seconds(request.prompt_tokens)
                request.kv_ready_time = now + request.kv_transfer_s
                if request.scheduled_time is None:
                    request.scheduled_time = now
                self.transferring.append(request)
                continue
            if request.computed == 0 and request.block_hashes:
                self._reuse_prefix(request)
            tokens = min(request.prefill_target - request.computed, budget)
            if not self._grow(request, tokens):
                self._release(request)
                request.computed = 0
                break
            self.waiting.popleft()
            if request.scheduled_time is None:
                request.scheduled_time = now
            self.running.append(request)
            work.append((request, tokens))
            budget -= tokens
        if not work:
            return None
        decode_seqs = decode_context = prefill_tokens = prefill_seqs = prefill_context = 0
        pairs = earlier_pairs = 0.0
        for request, tokens in work:
            if request.computed >= request.prefill_target:
                decode_seqs += 1
                decode_context += request.computed
            else:
                prefill_seqs += 1
                prefill_tokens += tokens
                pairs += prefill_attention_pairs(request.computed, tokens)
                earlier_pairs += float(tokens * request.computed)
                prefill_context += request.computed + tokens
        load = StepLoad(decode_seqs, decode_context, prefill_tokens, pairs, prefill_seqs, prefill_context,
                        earlier_pairs)
        return StepPlan(work, load, model.step_seconds(load))

    def complete(self, plan: StepPlan, end: float) -> StepOutcome:
        """Apply a planned step that ended at `end`: emit tokens, finish requests, free their KV."""
        outcome = StepOutcome()
        for request, tokens in plan.work:
            if request.finished:  # aborted during the step
                continue
            was_prefill = request.computed < request.prefill_target
            request.computed += tokens
            if was_prefill and request.computed < request.prefill_target:
                continue  # more prefill chunks to go; no token yet
            if was_prefill and request.block_hashes:
                self._cache_prompt(request)
            request.generated += 1
            request.prev_token_time = request.last_token_time
            request.last_token_time = end
            if request.first_token_time is None:
                request.first_token_time = end
            outcome.emitted.append(request)
            if request.generated >= request.output_tokens:
                request.finished = True
                self._release(request)
                outcome.finished.append(request)
        if outcome.finished:
            done = {id(r) for r in outcome.finished}
            self.running = [r for r in self.running if id(r) not in done]
        return outcome


def chained_block_hashes(tokens: Sequence[Hashable], block_size: int) -> tuple[int, ...]:
    """vLLM's prefix-cache keys: each full block's hash covers its tokens and the previous block's hash."""
    hashes = []
    previous = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, tuple(tokens[start:start + block_size])))
        hashes.append(previous)
    return tuple(hashes)
