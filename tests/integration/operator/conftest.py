"""Fixtures: one emulated API server per test module, and clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest
import yaml
from operator_harness import ApiServer


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with ApiServer() as server:
        kubeconfig = tmp_path_factory.mktemp("kube") / "config"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emu", "cluster": {"server": server.url}}],
                    "users": [{"name": "emu", "user": {"token": "test"}}],
                    "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                    "current-context": "emu",
                }
            )
        )
        with pytest.MonkeyPatch.context() as patcher:
            patcher.setenv("KUBECONFIG", str(kubeconfig))
            # The client reads $KUBECONFIG once, at import; both kopf and the operator use it.
            patcher.setattr(
                kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig)
            )
            patcher.delenv("KUBERNETES_SERVICE_HOST", raising=False)
            kubernetes.config.load_kube_config(config_file=str(kubeconfig))
            yield server


@pytest.fixture(scope="module")
def custom_api(api_server: ApiServer) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi()


@pytest.fixture(scope="module")
def apps_api(api_server: ApiServer) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api()
