"""The PodDisruptionBudget: voluntary evictions (node drains) take one worker at a time."""

from __future__ import annotations

from typing import Any

from radixserve_operator.manifests.meta import Owner, object_meta, selector_labels


def build_disruption_budget(owner: Owner) -> dict[str, Any]:
    # maxUnavailable (not minAvailable) so a one-replica service never blocks a node drain.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner)},
        },
    }
