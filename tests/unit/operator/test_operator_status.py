"""Status conditions from the Deployment, its pods and the last reconcile, and their Events."""

from __future__ import annotations

from typing import Any

from radixserve_operator.reconcile import EventNote, _transitions
from radixserve_operator.status import (
    WORKER_PROBLEMS,
    DeploymentState,
    Problem,
    compute_status,
    problem_from_status,
    worker_problem,
)

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
    dep: dict | None,
    problem: Problem | None = None,
    previous: dict | None = None,
    now: str = "T1",
    workers: Problem | None = None,
) -> dict:
    return compute_status(
        observed_generation=5,
        deployment=DeploymentState.from_body(dep) if dep else None,
        problem=problem,
        selector=SELECTOR,
        url="http://svc.ns.svc:8000",
        previous=previous,
        now=now,
        workers=workers,
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


def worker_pod(
    name: str = "svc-7d9-abcde",
    *,
    waiting: str | None = None,
    terminated: dict | None = None,
    last_terminated: dict | None = None,
    restarts: int = 0,
    unschedulable: str | None = None,
    deleting: bool = False,
) -> dict:
    """A worker pod's status as the kubelet and the scheduler write it."""
    container: dict[str, Any] = {"name": "worker", "restartCount": restarts, "state": {}}
    if waiting:
        container["state"]["waiting"] = {"reason": waiting, "message": f"{waiting} detail"}
    if terminated:
        container["state"]["terminated"] = terminated
    if last_terminated:
        container["lastState"] = {"terminated": last_terminated}
    if not container["state"]:
        container["state"]["running"] = {"startedAt": "T0"}
    conditions = []
    if unschedulable:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }  # fmt: skip
        )
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "T9"
    status = {"conditions": conditions, "containerStatuses": [] if unschedulable else [container]}
    return {"metadata": meta, "status": status}


CRASH = {"reason": "Error", "exitCode": 1, "message": "ValueError: no such model\n"}
OOM = {"reason": "OOMKilled", "exitCode": 137}


def test_healthy_or_starting_pods_are_no_problem() -> None:
    assert worker_problem([]) is None
    assert worker_problem([worker_pod(), worker_pod(waiting="ContainerCreating")]) is None
    # a crash that is not (yet) a loop: the kubelet restarts it at once
    assert worker_problem([worker_pod(last_terminated=CRASH, restarts=1)]) is None


def test_crash_loop_names_the_pod_and_the_last_termination_message() -> None:
    pod = worker_pod(waiting="CrashLoopBackOff", last_terminated=CRASH, restarts=4)
    problem = worker_problem([pod])
    assert problem is not None and problem.reason == "CrashLoopBackOff"
    assert "svc-7d9-abcde" in problem.message and "restarts: 4" in problem.message
    assert problem.message.endswith("last exit code 1: ValueError: no such model")


def test_long_termination_messages_keep_their_end() -> None:
    log = "BEGIN\n" + "x" * 5000 + "\nRuntimeError: the real cause"
    pod = worker_pod(waiting="CrashLoopBackOff", last_terminated={**CRASH, "message": log})
    message = worker_problem([pod]).message
    assert message.endswith("RuntimeError: the real cause") and "BEGIN" not in message
    assert len(message) < 800


def test_oom_kill_wins_over_the_crash_loop_it_causes() -> None:
    looping = worker_pod(waiting="CrashLoopBackOff", last_terminated=OOM, restarts=2)
    problem = worker_problem([looping])
    assert problem.reason == "OOMKilled" and "memory limit" in problem.message
    # the same while the container is still terminated, before the kubelet restarts it
    assert worker_problem([worker_pod(terminated=OOM)]).reason == "OOMKilled"


def test_unschedulable_carries_the_schedulers_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    problem = worker_problem([worker_pod(unschedulable=message)])
    assert problem == Problem("Unschedulable", f"pod svc-7d9-abcde cannot be scheduled: {message}")


def test_image_pull_failures_are_reported() -> None:
    problem = worker_problem([worker_pod(waiting="ImagePullBackOff")])
    assert problem.reason == "ImagePullBackOff" and "ImagePullBackOff detail" in problem.message


def test_most_telling_problem_of_all_pods_in_a_stable_order() -> None:
    pods = [
        worker_pod("b", unschedulable="no GPU"),
        worker_pod("c", waiting="CrashLoopBackOff", last_terminated=CRASH),
        worker_pod("a", waiting="CrashLoopBackOff", last_terminated=CRASH),
        worker_pod(),
    ]
    assert worker_problem(pods).message.startswith("pod a:")
    assert worker_problem(reversed(pods)) == worker_problem(pods)
    # pods on their way out (a rollout replacing them) are not the service's problem
    assert worker_problem([worker_pod(waiting="CrashLoopBackOff", deleting=True)]) is None


def test_worker_problem_is_degraded_after_a_reconcile_problem() -> None:
    crash = Problem("CrashLoopBackOff", "pod p is crash-looping")
    both = status_of(deployment(1, 0), Problem("InvalidSpec", "bad"), workers=crash)
    assert conditions(both)["Degraded"] == ("True", "InvalidSpec")
    only_pods = status_of(deployment(1, 0), previous=both, now="T2", workers=crash)
    assert conditions(only_pods)["Degraded"] == ("True", "CrashLoopBackOff")
    assert problem_from_status(only_pods) is None  # not a reconcile problem
    assert problem_from_status(only_pods, WORKER_PROBLEMS) == crash
    assert _transitions(both, only_pods) == [
        EventNote("Warning", "CrashLoopBackOff", "pod p is crash-looping")
    ]
