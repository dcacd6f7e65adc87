"""The InferenceService ``status``: conditions from the Deployment, its pods and the last reconcile.

Pure: the reconcile handler and the Deployment and pod watchers all call ``compute_status`` and
patch the result, so the paths cannot disagree about what "Ready" means. A worker that cannot
start (crash-looping, OOM-killed, unschedulable, its image not pullable) is read from the pods
by ``worker_problem`` and shown as ``Degraded``, with the last termination message.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
ROUTER_READY = "RouterReady"
# spec.loras (placement all): a worker refused an adapter. The adapter sync owns it;
# compute_status keeps it as it was.
LORA_LOAD_FAILED = "LoraLoadFailed"

# Degraded reasons that only a reconcile can set or clear (the Deployment cannot show them).
RECONCILE_PROBLEMS = frozenset(
    {"InvalidSpec", "ApplyFailed", "AutoscalingUnavailable", "InferencePoolUnavailable"}
)
# Degraded reasons that only the pod watcher can set or clear, most telling first.
CRASH_LOOP = "CrashLoopBackOff"
OOM_KILLED = "OOMKilled"
UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL = "ImagePullBackOff"
WORKER_PROBLEMS = (OOM_KILLED, CRASH_LOOP, IMAGE_PULL, UNSCHEDULABLE)
# Kubernetes keeps a termination message to 4 KiB; a condition shows its end (the last lines).
MESSAGE_TAIL_CHARS = 600


@dataclass(frozen=True)
class Problem:
    """Why the last reconcile could not do everything: a Degraded reason and its message."""

    reason: str
    message: str


@dataclass(frozen=True)
class DeploymentState:
    """The few Deployment fields the status is made of."""

    desired: int
    replicas: int
    ready: int
    updated: int
    current_generation_observed: bool
    deadline_exceeded: bool

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> DeploymentState:
        status = body.get("status") or {}
        generation = (body.get("metadata") or {}).get("generation", 0)
        conditions = status.get("conditions") or []
        return cls(
            desired=int((body.get("spec") or {}).get("replicas", 1)),
            replicas=int(status.get("replicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            current_generation_observed=status.get("observedGeneration", 0) >= generation,
            deadline_exceeded=any(
                c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
                for c in conditions
            ),
        )

    @property
    def rolled_out(self) -> bool:
        return (
            self.current_generation_observed
            and self.updated >= self.desired
            and self.ready >= self.desired
            and self.replicas == self.desired
        )


def problem_from_status(
    status: Mapping[str, Any] | None, reasons: Collection[str] = RECONCILE_PROBLEMS
) -> Problem | None:
    """The problem with one of ``reasons`` that a previous status recorded, to keep it across
    events that cannot see it (a reconcile problem on a Deployment event, a pod problem on a
    reconcile)."""
    for condition in (status or {}).get("conditions") or []:
        if (
            condition.get("type") == DEGRADED
            and condition.get("status") == "True"
            and condition.get("reason") in reasons
        ):
            return Problem(condition["reason"], condition.get("message", ""))
    return None


def worker_problem(pods: Iterable[Mapping[str, Any]]) -> Problem | None:
    """Why the service's worker pods cannot start, or ``None`` while they can.

    Each pod gives at most one problem (its most telling); of all pods', the most telling
    reason is reported, from the first pod by name, so the result does not depend on order.
    """
    found = [
        (WORKER_PROBLEMS.index(problem.reason), pod_name, problem)
        for pod in pods
        if (problem := _pod_problem(pod)) is not None
        for pod_name in [(pod.get("metadata") or {}).get("name", "")]
    ]
    return min(found, key=lambda item: item[:2])[2] if found else None


def _pod_problem(pod: Mapping[str, Any]) -> Problem | None:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None  # going away (a rollout or scale-down): not the service's problem
    name = meta.get("name", "?")
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            detail = condition.get("message") or "no node fits the pod"
            return Problem(UNSCHEDULABLE, f"pod {name} cannot be scheduled: {detail}")
    problems = []
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        terminated = (container.get("state") or {}).get("terminated") or (
            (container.get("lastState") or {}).get("terminated") or {}
        )
        restarts = container.get("restartCount", 0)
        where = f"pod {name}: container {container.get('name', '?')}"
        if terminated.get("reason") == OOM_KILLED:
            message = f"{where} was OOM-killed (restarts: {restarts}); raise its memory limit"
            problems.append(Problem(OOM_KILLED, message + _termination(terminated)))
        elif waiting.get("reason") == CRASH_LOOP:
            message = f"{where} is crash-looping (restarts: {restarts})"
            problems.append(Problem(CRASH_LOOP, message + _termination(terminated)))
        elif waiting.get("reason") in (IMAGE_PULL, "ErrImagePull", "InvalidImageName"):
            detail = waiting.get("message") or waiting["reason"]
            problems.append(Problem(IMAGE_PULL, f"{where} cannot pull its image: {detail}"))
    return min(problems, key=lambda p: WORKER_PROBLEMS.index(p.reason)) if problems else None


def _termination(terminated: Mapping[str, Any]) -> str:
    """The last termination, as a message suffix: exit code and the message's end."""
    if not terminated:
        return ""
    text = f"; last exit code {terminated.get('exitCode', '?')}"
    message = (terminated.get("message") or "").strip()
    if message:
        tail = message[-MESSAGE_TAIL_CHARS:]
        text += ": " + ("..." + tail if len(tail) < len(message) else tail)
    return text


def compute_status(
    *,
    observed_generation: int | None,
    deployment: DeploymentState | None,
    problem: Problem | None,
    selector: str,
    url: str | None,
    previous: Mapping[str, Any] | None,
    now: str,
    workers: Problem | None = None,
    router: DeploymentState | None = None,
) -> dict[str, Any]:
    """The full ``status`` object; ``lastTransitionTime`` only moves when a condition flips.

    ``problem`` is the last reconcile's, ``workers`` the pods' (``worker_problem``): a spec
    that cannot be applied is named before the pods that run the previous one. ``router`` is
    the router Deployment's state when the spec enables the router."""
    conditions = [
        _ready(deployment, problem),
        _progressing(deployment, problem),
        _degraded(deployment, problem or workers),
    ]
    if router is not None:
        conditions[0] = _ready_behind_router(conditions[0], deployment, router)
        conditions.append(_router_ready(router))
    previous_conditions = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    kept = (
        [previous_conditions[LORA_LOAD_FAILED]] if LORA_LOAD_FAILED in previous_conditions else []
    )
    status: dict[str, Any] = {
        "replicas": deployment.replicas if deployment else 0,
        "readyReplicas": deployment.ready if deployment else 0,
        "selector": selector,
        "conditions": [
            _with_times(
                condition, previous_conditions.get(condition["type"]), now, observed_generation
            )
            for condition in conditions
        ]
        + kept,
    }
    if observed_generation is not None:
        status["observedGeneration"] = observed_generation
    if url is not None:
        status["url"] = url
    if router is not None:
        status["router"] = {"replicas": router.replicas, "readyReplicas": router.ready}
    return status


def _router_ready(router: DeploymentState) -> dict[str, str]:
    counts = f"{router.ready}/{router.desired} router replicas ready"
    if router.ready > 0:
        return _condition(ROUTER_READY, True, "RouterReady", counts)
    return _condition(ROUTER_READY, False, "RouterNotReady", counts)


def _ready_behind_router(
    ready: dict[str, str], deployment: DeploymentState | None, router: DeploymentState
) -> dict[str, str]:
    """Requests reach the workers through the router: no router, no service. With one, a
    service scaled to zero still takes requests (the router holds them while a worker starts)."""
    if router.ready == 0:
        return _condition(READY, False, "RouterNotReady", "no router replica is ready")
    if deployment is not None and deployment.desired == 0:
        return _condition(
            READY,
            True,
            "ScaledToZero",
            "no worker runs; the router holds requests while the autoscaler starts one",
        )
    return ready


def _ready(deployment: DeploymentState | None, problem: Problem | None) -> dict[str, str]:
    if deployment is None:
        reason = problem.reason if problem else "DeploymentPending"
        return _condition(READY, False, reason, "no worker Deployment yet")
    counts = f"{deployment.ready}/{deployment.desired} replicas ready"
    if deployment.desired == 0:
        return _condition(READY, False, "ScaledToZero", "the service has 0 replicas")
    if deployment.ready >= deployment.desired:
        return _condition(READY, True, "ReplicasReady", counts)
    return _condition(READY, False, "ReplicasNotReady", counts)


def _progressing(deployment: DeploymentState | None, problem: Problem | None) -> dict[str, str]:
    if deployment is None:
        if problem is not None:
            return _condition(PROGRESSING, False, problem.reason, problem.message)
        return _condition(PROGRESSING, True, "Creating", "creating the worker Deployment")
    if deployment.deadline_exceeded:
        return _condition(
            PROGRESSING, False, "ProgressDeadlineExceeded", "the rollout stopped progressing"
        )
    if deployment.rolled_out:
        return _condition(
            PROGRESSING, False, "RolloutComplete", "all replicas run the current spec"
        )
    message = (
        f"{deployment.updated}/{deployment.desired} replicas updated, {deployment.ready} ready"
    )
    return _condition(PROGRESSING, True, "RollingOut", message)


def _degraded(deployment: DeploymentState | None, problem: Problem | None) -> dict[str, str]:
    if problem is not None:
        return _condition(DEGRADED, True, problem.reason, problem.message)
    if deployment is not None and deployment.deadline_exceeded:
        return _condition(
            DEGRADED,
            True,
            "ProgressDeadlineExceeded",
            "worker pods did not become ready in time; see the pods' events and logs",
        )
    return _condition(DEGRADED, False, "AsExpected", "no problems found")


def _condition(kind: str, status: bool, reason: str, message: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }


def _with_times(
    condition: dict[str, Any],
    previous: Mapping[str, Any] | None,
    now: str,
    observed_generation: int | None,
) -> dict[str, Any]:
    unchanged = previous is not None and previous.get("status") == condition["status"]
    result = {
        **condition,
        "lastTransitionTime": previous["lastTransitionTime"]
        if unchanged and previous.get("lastTransitionTime")
        else now,
    }
    if observed_generation is not None:
        result["observedGeneration"] = observed_generation
    return result


def lora_status(
    wanted: Sequence[tuple[str, str, str]],
    held: Iterable[Mapping[str, str]],
    refused: Mapping[str, str],
) -> list[dict[str, Any]]:
    """``status.loras``: per adapter of spec.loras (``wanted``: name, source, the path the
    worker loads), how many ready workers hold it from that path (``held``: each ready
    worker's adapters, name -> path) and, when a worker refused it, that refusal."""
    holdings = list(held)
    entries = []
    for name, source, path in wanted:
        entry: dict[str, Any] = {
            "name": name,
            "source": source,
            "readyWorkers": sum(1 for adapters in holdings if adapters.get(name) == path),
        }
        if name in refused:
            entry["message"] = refused[name]
        entries.append(entry)
    return entries


def lora_conditions(
    previous: Mapping[str, Any], refused: Mapping[str, str], now: str
) -> list[dict[str, Any]]:
    """The previous conditions with ``LoraLoadFailed`` set from ``refused`` (adapter name ->
    the worker's refusal, naming the pod); its transition time moves only when it flips."""
    conditions = [c for c in previous.get("conditions") or [] if c.get("type") != LORA_LOAD_FAILED]
    old = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == LORA_LOAD_FAILED), None
    )
    if refused:
        text = "; ".join(f"{name}: {message}" for name, message in sorted(refused.items()))
        tail = text if len(text) <= MESSAGE_TAIL_CHARS else text[: MESSAGE_TAIL_CHARS - 3] + "..."
        condition = _condition(LORA_LOAD_FAILED, True, "LoadFailed", tail)
    else:
        condition = _condition(
            LORA_LOAD_FAILED, False, "AsExpected", "every worker took every adapter it was given"
        )
    return conditions + [_with_times(condition, old, now, previous.get("observedGeneration"))]
