"""Status conditions from the Deployment and the last reconcile, and the Events they imply."""

from __future__ import annotations

from typing import Any

from radixserve_operator.reconcile import EventNote, _transitions
from radixserve_operator.status import DeploymentState, Problem, compute_status, problem_from_status

SELECTOR = "app.kubernetes.io/name=radixserve,radixserve.io/inferenceservice=svc"


def deployment(desired: int, ready: int, updated: int | None = None, **status: Any) -> dict:
    return {
        "metadata": {"generation": 3},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": 3,
            "replicas": desired,
            "readyReplicas": ready,
            "updatedReplicas": desired if updated is None else updated,
            **status,
        },
    }


def status_of(
    dep: dict | None, problem: Problem | None = None, previous: dict | None = None, now: str = "T1"
) -> dict:
    return compute_status(
        observed_generation=5,
        deployment=DeploymentState.from_body(dep) if dep else None,
        problem=problem,
        selector=SELECTOR,
        url="http://svc.ns.svc:8000",
        previous=previous,
        now=now,
    )


def conditions(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_all_ready_is_ready_and_complete() -> None:
    status = status_of(deployment(2, 2))
    assert conditions(status) == {
        "Ready": ("True", "ReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert (status["replicas"], status["readyReplicas"], status["observedGeneration"]) == (2, 2, 5)
    assert status["selector"] == SELECTOR
    assert all(c["observedGeneration"] == 5 for c in status["conditions"])


def test_rolling_out_is_progressing_not_ready() -> None:
    status = status_of(deployment(3, 1, updated=2))
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    assert conditions(status)["Progressing"] == ("True", "RollingOut")


def test_stale_deployment_generation_is_still_progressing() -> None:
    dep = deployment(1, 1)
    dep["metadata"]["generation"] = 4
    assert conditions(status_of(dep))["Progressing"] == ("True", "RollingOut")


def test_deadline_exceeded_is_degraded() -> None:
    dep = deployment(
        1,
        0,
        conditions=[
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
        ],
    )
    assert conditions(status_of(dep))["Degraded"] == ("True", "ProgressDeadlineExceeded")


def test_scaled_to_zero_is_not_ready() -> None:
    assert conditions(status_of(deployment(0, 0)))["Ready"] == ("False", "ScaledToZero")


def test_invalid_spec_keeps_the_running_deployment_truthful() -> None:
    problem = Problem("InvalidSpec", "bad gpu count")
    status = status_of(deployment(1, 1), problem)
    assert conditions(status)["Ready"] == ("True", "ReplicasReady")  # the old pods still serve
    assert conditions(status)["Degraded"] == ("True", "InvalidSpec")
    assert problem_from_status(status) == problem
    assert conditions(status_of(None, problem))["Ready"] == ("False", "InvalidSpec")


def test_transition_time_moves_only_on_flips() -> None:
    first = status_of(deployment(1, 0), now="T1")
    same = status_of(deployment(1, 0), previous=first, now="T2")
    flipped = status_of(deployment(1, 1), previous=same, now="T3")
    times = {c["type"]: c["lastTransitionTime"] for c in same["conditions"]}
    assert set(times.values()) == {"T1"}
    flipped_times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert flipped_times == {"Ready": "T3", "Progressing": "T3", "Degraded": "T1"}


def test_events_for_important_transitions_only() -> None:
    pending = status_of(deployment(1, 0))
    ready = status_of(deployment(1, 1), previous=pending)
    degraded = status_of(deployment(1, 1), Problem("ApplyFailed", "boom"), previous=ready)
    recovered = status_of(deployment(1, 1), previous=degraded)
    assert _transitions(pending, ready) == [EventNote("Normal", "Ready", "1/1 replicas ready")]
    assert _transitions(ready, ready) == []
    assert _transitions(ready, degraded) == [EventNote("Warning", "ApplyFailed", "boom")]
    assert _transitions(degraded, recovered) == [
        EventNote("Normal", "Recovered", "no longer degraded")
    ]
    assert [n.reason for n in _transitions(ready, pending)] == ["NotReady"]
