"""The Pod Security Standards' `restricted` profile as a check on a pod spec.

Written from the published standard (kubernetes.io/docs/concepts/security/pod-security-standards,
"Baseline" and "Restricted" controls, Kubernetes 1.30): `restricted` is every baseline control
plus its own. `restricted_violations` returns one message per violated control and container,
the way `kubectl label ns ... pod-security.kubernetes.io/enforce=restricted` would refuse it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Baseline "Capabilities": what a container may add beyond the runtime's default set.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# Baseline "Sysctls": the safe set.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
# Restricted "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUME_SOURCES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _baseline(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> Iterator[str]:
    pod_sc = pod.get("securityContext") or {}
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        yield "HostProcess: pod securityContext.windowsOptions.hostProcess"
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"Host Namespaces: {field} is true"
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            yield f"HostPath Volumes: volume {volume.get('name')!r}"
    if (pod_sc.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in APPARMOR_TYPES:
        yield "AppArmor: pod appArmorProfile.type"
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            yield f"AppArmor: annotation {key}={value}"
    yield from _selinux("pod", pod_sc.get("seLinuxOptions"))
    if (pod_sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield "Seccomp: pod seccompProfile.type is Unconfined"
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"Sysctls: {sysctl.get('name')} is not in the safe set"
    for container in _containers(pod):
        name = container.get("name")
        sc = container.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"HostProcess: container {name!r}"
        if sc.get("privileged"):
            yield f"Privileged Containers: container {name!r}"
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            yield f"Capabilities: container {name!r} adds {sorted(added - BASELINE_CAPABILITIES)}"
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                yield f"Host Ports: container {name!r} hostPort {port['hostPort']}"
        apparmor = (sc.get("appArmorProfile") or {}).get("type", "RuntimeDefault")
        if apparmor not in APPARMOR_TYPES:
            yield f"AppArmor: container {name!r} appArmorProfile.type {apparmor}"
        yield from _selinux(f"container {name!r}", sc.get("seLinuxOptions"))
        if sc.get("procMount", "Default") != "Default":
            yield f"/proc Mount Type: container {name!r} procMount {sc['procMount']}"
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"Seccomp: container {name!r} seccompProfile.type is Unconfined"


def _selinux(where: str, options: Mapping[str, Any] | None) -> Iterator[str]:
    options = options or {}
    if options.get("type", "") not in SELINUX_TYPES:
        yield f"SELinux: {where} seLinuxOptions.type {options['type']}"
    for field in ("user", "role"):
        if options.get(field):
            yield f"SELinux: {where} seLinuxOptions.{field} is set"


def _restricted(pod: Mapping[str, Any]) -> Iterator[str]:
    pod_sc = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            yield f"Volume Types: volume {volume.get('name')!r} uses {sorted(sources)}"
    for field in ("runAsUser", "runAsGroup", "fsGroup"):
        if pod_sc.get(field) == 0:
            yield f"Running as Non-root user / groups: pod {field} is 0"
    if 0 in (pod_sc.get("supplementalGroups") or []):
        yield "Non-root groups: pod supplementalGroups holds 0"
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for container in _containers(pod):
        name = container.get("name")
        sc = container.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            yield f"Privilege Escalation: container {name!r} does not set it to false"
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            yield f"Running as Non-root: container {name!r} may run as root"
        for field in ("runAsUser", "runAsGroup"):
            if sc.get(field) == 0:
                yield f"Running as Non-root user / groups: container {name!r} {field} is 0"
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield f"Seccomp: container {name!r} has no RuntimeDefault or Localhost profile"
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"Capabilities: container {name!r} does not drop ALL"
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            yield f"Capabilities: container {name!r} adds {sorted(added)}"


def restricted_violations(
    pod: Mapping[str, Any], annotations: Mapping[str, str] | None = None
) -> list[str]:
    """Every `restricted` control (baseline included) that this pod spec violates."""
    return [*_baseline(pod, annotations or {}), *_restricted(pod)]
