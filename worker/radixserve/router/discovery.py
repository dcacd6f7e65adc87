"""Where the workers are: a fixed list, or the ready endpoints of EndpointSlices, watched.

EndpointSlices carry the labels of their Service (plus `kubernetes.io/service-name`), so the
selector names the workers' (headless) Service, for example
`kubernetes.io/service-name=llama-workers`. Only endpoints whose `ready` condition is not false
count (the API says a missing condition means ready); a pod that starts draining turns not
ready and leaves the pool before its SIGTERM, so it gets no new requests.

The watch runs the official `kubernetes` client (blocking) in a daemon thread: list, then watch
from the list's resourceVersion; on any error it lists again after a backoff. Every change of
the set of URLs is handed to the event loop with `call_soon_threadsafe`. The first list runs in
`connect()`, before the router serves, so an unreachable API or a missing permission is an
error at start, not a router that silently has no workers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_TIMEOUT_S = 300  # the API server ends a watch after this; we then watch again
CONNECT_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 30.0


class DiscoveryError(Exception):
    """Discovery cannot start: the message says what to fix."""


def parse_selector(text: str) -> dict[str, str]:
    """`key=value[,key=value...]` (equality only) as a dict; ValueError on anything else."""
    selector: dict[str, str] = {}
    for term in text.split(","):
        key, sep, value = term.strip().partition("=")
        key, value = key.strip(), value.strip().removeprefix("=")  # `==` means `=`
        if not sep or not key or key.endswith("!"):
            raise ValueError(f"selector term {term.strip()!r} is not key=value")
        selector[key] = value
    return selector


def default_namespace() -> str:
    """The pod's own namespace in a cluster, `default` elsewhere."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def ready_urls(endpoint_slice: Mapping[str, Any], port: str, scheme: str = "http") -> set[str]:
    """URLs of the slice's ready endpoints on `port` (a port name, or a number)."""
    number = _port_number(endpoint_slice, port)
    if number is None:
        return set()
    ipv6 = endpoint_slice.get("addressType") == "IPv6"
    urls = set()
    for endpoint in endpoint_slice.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        addresses = endpoint.get("addresses") or []
        if addresses:
            host = f"[{addresses[0]}]" if ipv6 else addresses[0]
            urls.add(f"{scheme}://{host}:{number}")
    return urls


def _port_number(endpoint_slice: Mapping[str, Any], port: str) -> int | None:
    if port.isdigit():
        return int(port)
    for entry in endpoint_slice.get("ports") or []:
        if entry.get("name") == port and entry.get("port"):
            return int(entry["port"])
    return None


class SliceBook:
    """The ready URLs of every matching EndpointSlice, by slice name."""

    def __init__(self, selector: Mapping[str, str], port: str) -> None:
        self.selector = dict(selector)
        self.port = port
        self._urls: dict[str, set[str]] = {}

    def urls(self) -> set[str]:
        return set().union(*self._urls.values())

    def replace(self, slices: list[Mapping[str, Any]]) -> None:
        self._urls = {}
        for endpoint_slice in slices:
            self.apply("ADDED", endpoint_slice)

    def apply(self, event_type: str, endpoint_slice: Mapping[str, Any]) -> None:
        meta = endpoint_slice.get("metadata") or {}
        name = meta.get("name", "")
        labels = meta.get("labels") or {}
        # The API server filters by the selector; filtering again costs nothing and keeps a
        # slice that lost its labels from lingering.
        if event_type == "DELETED" or any(labels.get(k) != v for k, v in self.selector.items()):
            self._urls.pop(name, None)
        else:
            self._urls[name] = ready_urls(endpoint_slice, self.port)


class EndpointSliceDiscovery:
    """Watches EndpointSlices and reports the set of ready worker URLs on every change."""

    def __init__(self, *, namespace: str, selector: str, port: str) -> None:
        self.namespace = namespace
        self.selector_text = selector
        self.book = SliceBook(parse_selector(selector), port)
        self._on_change: Callable[[set[str]], None] = lambda urls: None
        self._api: Any = None
        self._resource_version: str | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def connect(self) -> set[str]:
        """Load the cluster credentials and list once; DiscoveryError says why that failed."""
        import kubernetes

        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                kubernetes.config.load_incluster_config()
            else:  # $KUBECONFIG as it is now (the client reads it once, at import)
                kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise DiscoveryError(
                f"no Kubernetes credentials for EndpointSlice discovery: {exc}"
                " (run in a pod with a service account, or set KUBECONFIG)"
            ) from None
        self._api = kubernetes.client.DiscoveryV1Api()
        host = self._api.api_client.configuration.host
        try:
            self._list()
        except Exception as exc:
            raise DiscoveryError(
                f"cannot list EndpointSlices in namespace {self.namespace!r} with selector"
                f" {self.selector_text!r} at {host}: {_reason(exc)}"
            ) from None
        return self.book.urls()

    def start(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[set[str]], None]) -> None:
        """Watch from the listed state on; `on_change(urls)` runs on `loop`."""
        self._loop, self._on_change = loop, on_change
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The thread ends at its next event or timeout; as a daemon it never holds up exit."""
        self._stopped.set()

    def _list(self) -> None:
        reply = self._api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=self.selector_text,
            _preload_content=False,
            _request_timeout=CONNECT_TIMEOUT_S,
        )
        body = json.loads(reply.data)
        self.book.replace(body.get("items") or [])
        self._resource_version = (body.get("metadata") or {}).get("resourceVersion")

    def _run(self) -> None:
        import kubernetes

        backoff = 1.0
        listed = True  # connect() listed already
        while not self._stopped.is_set():
            try:
                if not listed:
                    self._list()
                    self._publish()
                listed = False
                watch = kubernetes.watch.Watch()
                events = watch.stream(
                    self._api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=self.selector_text,
                    resource_version=self._resource_version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    _request_timeout=(CONNECT_TIMEOUT_S, WATCH_TIMEOUT_S + 30),
                    deserialize=False,
                )
                for event in events:
                    if self._stopped.is_set():
                        watch.stop()
                        return
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        obj = event["object"]
                        self.book.apply(event["type"], obj)
                        self._resource_version = obj["metadata"].get("resourceVersion")
                        self._publish()
                backoff = 1.0
                listed = True  # the watch timed out cleanly: watch on from where it stopped
            except Exception as exc:
                if self._stopped.is_set():
                    return
                logger.warning("EndpointSlice watch failed (%s); listing again", _reason(exc))
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _publish(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_change, self.book.urls())


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"{type(exc).__name__}: {exc}"
