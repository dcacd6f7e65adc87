"""Which waiting requests run next, and how many fit.

`SchedulePolicy` orders the waiting queue: LPM (longest cached prefix first, so requests that
share a prefix run while it is still cached) or FCFS. `PrefillAdder` admits requests in that
order under three budgets: the prefill token budget of one pass, the chunk size (a prompt longer
than what is left is cut into chunks), and the KV budget, which reserves room for the future
tokens of everything already running so admission rarely forces a retraction.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, auto
from typing import TYPE_CHECKING

from radixserve.mem_cache.base_prefix_cache import adapter_key

if TYPE_CHECKING:
    from radixserve.mem_cache.allocator import TokenSlotAllocator
    from radixserve.mem_cache.base_prefix_cache import BasePrefixCache
    from radixserve.scheduler.schedule_batch import Req

# Past this many waiting requests LPM's per-request prefix match costs more than it saves.
LPM_MAX_QUEUE = 128
# Future tokens reserved per request are capped: long max_new_tokens rarely all get used.
CLIP_MAX_NEW_TOKENS = 4096


def longest_prefix_first(waiting: list[Req], tree_cache: BasePrefixCache) -> tuple[list[Req], bool]:
    """LPM: requests that share a cached prefix run while it is still cached. It must match
    the whole queue to sort it, so past LPM_MAX_QUEUE (or with no cache) it falls back to
    arrival order."""
    if tree_cache.disabled or len(waiting) > LPM_MAX_QUEUE:
        return first_come_first_served(waiting, tree_cache)
    for req in waiting:
        req.init_next_round_input(tree_cache)
    # stable sort: equal prefixes keep arrival order
    return sorted(waiting, key=lambda r: -len(r.prefix_indices)), True


def first_come_first_served(
    waiting: list[Req], tree_cache: BasePrefixCache
) -> tuple[list[Req], bool]:
    """Arrival order; matching is left to admission, which matches only the requests it
    actually considers."""
    return list(waiting), False


# --schedule-policy name -> ordering: (waiting queue, prefix cache) -> (admission order,
# whether every request's prefix is already matched). A new policy is one function plus a line.
SCHEDULE_POLICIES: dict[str, Callable[[list[Req], BasePrefixCache], tuple[list[Req], bool]]] = {
    "lpm": longest_prefix_first,
    "fcfs": first_come_first_served,
}


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache: BasePrefixCache) -> None:
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"unknown schedule policy {policy!r}; one of {tuple(SCHEDULE_POLICIES)}"
            )
        self.policy = policy
        self._order = SCHEDULE_POLICIES[policy]
        self.tree_cache = tree_cache

    def order(self, waiting: list[Req]) -> tuple[list[Req], bool]:
        """The admission order, and whether every request's prefix is already matched."""
        return self._order(waiting, self.tree_cache)


class AddResult(Enum):
    CONTINUE = auto()  # admitted, room for more
    NO_TOKEN = auto()  # the KV budget is spent
    OTHER = auto()  # the pass's token budget is spent


class PrefillAdder:
    def __init__(
        self,
        tree_cache: BasePrefixCache,
        allocator: TokenSlotAllocator,
        running_reqs: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int,
    ) -> None:
        self.tree_cache = tree_cache
        self.new_token_ratio = new_token_ratio
        self.nothing_running = not running_reqs
        reserved = sum(self._future_tokens(r) for r in running_reqs)
        self.rem_total_tokens = allocator.available_size() + tree_cache.evictable_size() - reserved
        self.rem_input_tokens = max_prefill_tokens
        self.rem_chunk_tokens = chunked_prefill_size
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        # a restore from a lower KV tier evicted or split nodes: later requests match again
        self.cache_changed = False

    def _future_tokens(self, req: Req) -> int:
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        return int(min(max(left, 0), CLIP_MAX_NEW_TOKENS) * self.new_token_ratio)

    def add_chunked_req(self, req: Req) -> None:
        """Continue a request whose prompt is prefilled chunk by chunk. Its prefix (everything
        computed so far) is already locked by `cache_unfinished_req`. Its admission reserved
        the whole prompt; the chunk still never takes more than is left (decode rows of mixed
        passes may have used more than their reservation), and what it will need later stays
        reserved, so no request admitted beside it can take it."""
        req.extend_input_len = len(req.fill_ids) - len(req.prefix_indices)
        remaining = req.extend_input_len
        chunk = min(self._chunk_of(req), max(self.rem_total_tokens, 0))
        if chunk > 0:
            self._take(req, chunk, locked_tokens=0)
        self.rem_total_tokens -= remaining - chunk + self._future_tokens(req)

    def add_one_req(self, req: Req) -> AddResult:
        if self.rem_total_tokens <= 0:
            return AddResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or self.rem_chunk_tokens <= 0:
            return AddResult.OTHER
        if req.extend_input_len > self.rem_input_tokens and self.can_run_list:
            return AddResult.OTHER
        if req.restorable_tokens:
            self._restore(req)
        # the whole prompt must fit, also when it is prefilled in chunks: a chunked prompt
        # cannot give back what it holds, and with nothing evictable its next chunk would
        # find no slots (computed before the lock: what the request's parameters can break
        # must not leave a lock behind)
        remaining = req.extend_input_len
        future = self._future_tokens(req)
        # Locking the matched prefix takes it out of the evictable pool: count what it costs.
        before = self.tree_cache.evictable_size()
        if req.last_node is not None:
            self.tree_cache.inc_lock_ref(req.last_node)
        locked = before - self.tree_cache.evictable_size()
        alone = self.nothing_running and not self.can_run_list
        fits = remaining + locked + future <= self.rem_total_tokens
        if not fits and not (alone and remaining + locked <= self.rem_total_tokens):
            if req.last_node is not None:
                self.tree_cache.dec_lock_ref(req.last_node)
            return AddResult.NO_TOKEN
        chunk = self._chunk_of(req)
        self._take(req, chunk, locked)
        self.rem_total_tokens -= remaining - chunk + future
        if self.new_chunked_req is not None or self.rem_input_tokens <= 0:
            return AddResult.OTHER
        return AddResult.CONTINUE

    def _restore(self, req: Req) -> None:
        """Copy the request's prefix back from the host (or disk) tier when it would fit:
        restoring takes as many device slots as computing those tokens would."""
        if req.extend_input_len + self._future_tokens(req) > self.rem_total_tokens:
            return
        restored = self.tree_cache.restore(adapter_key(req.fill_ids[:-1], req.lora_uid))
        for tier, n in restored.items():
            req.restored_tokens[tier] = req.restored_tokens.get(tier, 0) + n
        self.cache_changed = True
        req.init_next_round_input(self.tree_cache)

    def _chunk_of(self, req: Req) -> int:
        return min(req.extend_input_len, self.rem_chunk_tokens)

    def _take(self, req: Req, chunk: int, locked_tokens: int) -> None:
        if chunk < req.extend_input_len:
            req.extend_input_len = chunk
            self.new_chunked_req = req
        self.can_run_list.append(req)
        self.rem_total_tokens -= chunk + locked_tokens
        self.rem_input_tokens -= chunk
        self.rem_chunk_tokens -= chunk
