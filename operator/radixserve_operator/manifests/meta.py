"""Names, labels and owner references shared by every child object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve_operator import API_VERSION, FIELD_MANAGER, KIND
from radixserve_operator.spec import DEFAULT_PORT, KVEvents

SERVICE_LABEL = "radixserve.io/inferenceservice"
APP_NAME = "radixserve"
HTTP_PORT_NAME = "http"
KV_EVENTS_PORT_NAME = "kv-events"
KV_EVENTS_REPLAY_PORT_NAME = "kv-events-replay"


def worker_ports(kv_events: KVEvents | None) -> list[tuple[str, int]]:
    """(name, port) of what a worker pod serves: HTTP, and its KV events when enabled."""
    ports = [(HTTP_PORT_NAME, DEFAULT_PORT)]
    if kv_events is not None:
        ports.append((KV_EVENTS_PORT_NAME, kv_events.port))
        if kv_events.replay_port is not None:
            ports.append((KV_EVENTS_REPLAY_PORT_NAME, kv_events.replay_port))
    return ports


def service_ports(kv_events: KVEvents | None) -> list[dict[str, Any]]:
    """A Service's ports in front of worker pods (each targets the container port's name)."""
    return [
        {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
        for name, port in worker_ports(kv_events)
    ]


@dataclass(frozen=True)
class Owner:
    """The InferenceService that owns the children: garbage collection follows its uid."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector_labels(owner: Owner) -> dict[str, str]:
    """The immutable pod selector: only labels that never change for a service's lifetime."""
    return {"app.kubernetes.io/name": APP_NAME, SERVICE_LABEL: owner.name}


def selector_string(owner: Owner) -> str:
    """The selector as the scale subresource's ``status.selector`` wants it."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(owner).items())


def common_labels(owner: Owner, component: str = "worker") -> dict[str, str]:
    return {
        **selector_labels(owner),
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": APP_NAME,
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
    }


def object_meta(owner: Owner, name: str | None = None, component: str = "worker") -> dict[str, Any]:
    return {
        "name": name or owner.name,
        "namespace": owner.namespace,
        "labels": common_labels(owner, component),
        "ownerReferences": [owner.reference()],
    }


def service_url(owner: Owner, port: int) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{port}"


def cli_flags(valued: list[tuple[str, object]]) -> list[str]:
    """``--flag=value`` for each pair whose value is set. Joined, not two words: a value that
    starts with a dash (a served model name, say) must not read as a flag of its own."""
    return [f"{flag}={value}" for flag, value in valued if value is not None]
