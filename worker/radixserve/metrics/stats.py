"""`SchedulerStats`: what the scheduler process reports for Prometheus with its outputs.

Defined here, beside the collectors that apply it, so the metrics package imports nothing of
the scheduler; the scheduler fills it and sends it over IPC (boundary.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SchedulerStats:
    """Scheduler-side metrics since the last report, applied to Prometheus in the front end."""

    num_running_requests: int
    num_queued_requests: int
    kv_cache_usage_ratio: float  # KV held by running or queued requests / capacity
    kv_cache_evictable_ratio: float  # prefix cache no request pins (reclaimable) / capacity
    prefix_cache_hit_rate: float
    max_total_tokens: int
    prefix_cache_queries_tokens: int = 0  # deltas
    prefix_cache_hits_tokens: int = 0  # every tier; those restored from a lower one:
    prefix_cache_hits_by_tier: dict[str, int] = field(default_factory=dict)  # host, disk
    # the KV tiers (--kv-host-memory): TieredRadixCache.tier_report(), None with them off
    kv_tiers: dict[str, Any] | None = None
    retractions: int = 0
    kv_events_published: int = 0  # KV events sent (--kv-events-endpoint)
    kv_events_dropped: int = 0  # cache updates dropped: the publisher's queue was full
    # speculative decoding since the last report: tokens proposed and accepted, and the tokens
    # each verified request emitted per step (accepted + 1)
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_acceptance_lengths: list[int] = field(default_factory=list)
    # LoRA adapters served: LoRAManager.report() (metrics/lora.py applies it); None without
    lora: dict[str, Any] | None = None
    # (mode label, batch size, batch tokens, seconds) for each forward step since last report
    steps: list[tuple[str, int, int, float]] = field(default_factory=list)
