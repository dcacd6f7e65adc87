"""The operator's own Kubernetes calls: server-side apply of children, reads, status patches.

kopf covers watching, its own bookkeeping and Events; what it has no public client for
(server-side apply of arbitrary kinds) goes through the official ``kubernetes`` client's
transport, so credentials, TLS and proxies are configured the way kopf's login found them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from radixserve_operator import API_VERSION, FIELD_MANAGER, KIND, PLURAL

# Plural names of every kind the operator writes (no discovery round-trip per call).
PLURALS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobjects",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "ConfigMap"): "configmaps",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
    (API_VERSION, KIND): PLURAL,
}


def object_path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{PLURALS[(api_version, kind)]}"
    return f"{path}/{name}" if name else path


class KubeApi:
    """Blocking calls (kopf runs sync handlers in its thread pool)."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._client = api_client

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's field manager; idempotent by construction."""
        meta = manifest["metadata"]
        path = object_path(
            manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
        )
        return self._call(
            "PATCH",
            path,
            body=manifest,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete if present; ``False`` when there was nothing (or no such kind) to delete."""
        try:
            self._call("DELETE", object_path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Read-only: the worker pods a status is computed from."""
        listed = self._call(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            query=[("labelSelector", label_selector)],
        )
        return listed.get("items") or []

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Read-only, by name (RBAC: get on secrets, no list): the Secret a spec names for the
        workers' key, which the adapter sync sends to their admin endpoints."""
        try:
            return self._call("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        path = object_path(API_VERSION, KIND, namespace, name) + "/status"
        return self._call(
            "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
        )

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(method, url, header_params=headers, body=body)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(
                http_resp=response, body=data.decode(errors="replace"), data=None
            )
        return json.loads(data) if data else {}
