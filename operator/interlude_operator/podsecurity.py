"""What an engine pod may be: the pool's `engine.podSpec` overrides (an allow-list) and the
Kubernetes *restricted* Pod Security Standard, checked on the pod the operator renders (pure).

Whoever may write an EnginePool gets pods made with the operator's rights. Were `engine.podSpec`
merged as given, that author could put a pod on the host's network, mount the node's disk or
run it privileged, even in a namespace whose admission would refuse such a pod from them. So
only fields that choose *where* a pod runs, or what it pulls with, pass:

* `nodeSelector`, `affinity`, `tolerations`, `topologySpreadConstraints`: placement only;
* `priorityClassName`: may preempt other pods, no more (the API server keeps the system-*
  classes to kube-system, and a ResourceQuota can limit the others);
* `imagePullSecrets`: Secrets of the pool's own namespace, for pulling only;
* `terminationGracePeriodSeconds`: how long a stopping engine keeps its sessions.

Refused, among the rest: `serviceAccountName` (engines never call the Kubernetes API, and any
account of the namespace, the operator's own included, would lend them its identity, cloud
workload identities too), `automountServiceAccountToken`, `securityContext`, `volumes`,
`containers`, `host*`, `runtimeClassName` (a runtime can hand a container every GPU of a node).
The engine's resources and env have their own fields (`engine.resources`, `engine.env`).

The checker follows https://kubernetes.io/docs/concepts/security/pod-security-standards/
(restricted, which includes baseline) over the pod spec; the AppArmor annotations of older
clusters live in the pod's metadata and are not looked at (the operator sets none).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# The podSpec fields a pool may set, and the JSON type each must have.
ALLOWED_OVERRIDES: dict[str, type] = {
    "nodeSelector": dict,
    "affinity": dict,
    "tolerations": list,
    "topologySpreadConstraints": list,
    "priorityClassName": str,
    "imagePullSecrets": list,
    "terminationGracePeriodSeconds": int,
}

RESTRICTED_VOLUMES = frozenset(
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
# Baseline's safe sysctls (namespaced, and unable to touch other pods or the node).
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
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
CONFINED = ("RuntimeDefault", "Localhost")  # seccomp and AppArmor profile types
ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


def allowed_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The pool's podSpec overrides, once each is on the allow-list and of its type; a
    ValueError names the first field refused."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ValueError("engine.podSpec must be a mapping of core/v1 PodSpec fields")
    out: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        kind = ALLOWED_OVERRIDES.get(key)
        if kind is None:
            raise ValueError(
                f"engine.podSpec.{key} is not allowed: engine pods take only "
                f"{', '.join(ALLOWED_OVERRIDES)} (the operator's pods pass the restricted "
                "Pod Security Standard)"
            )
        # bool is an int to Python, never to Kubernetes.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"engine.podSpec.{key} must be {_json_type(kind)}")
        if isinstance(value, int) and value < 0:
            raise ValueError(f"engine.podSpec.{key} must be >= 0, got {value}")
        out[key] = value
    return out


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """How a pod spec breaks the restricted Pod Security Standard; empty when it passes."""
    out = [f"{key} is true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    for volume in pod.get("volumes") or ():
        kinds = sorted(set(volume) - {"name"} - RESTRICTED_VOLUMES)
        if kinds:
            out.append(f"volume {volume.get('name')!r} is of type {', '.join(kinds)}")
    pod_context: Mapping[str, Any] = pod.get("securityContext") or {}
    for sysctl in pod_context.get("sysctls") or ():
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')} is not a safe one")
    out += _context_violations("the pod", pod_context)
    for container in _containers(pod):
        out += _container_violations(container, pod_context)
    return out


def require_restricted(pod: Mapping[str, Any]) -> None:
    """Raise a ValueError saying how the pod breaks the restricted standard, if it does."""
    violations = restricted_violations(pod)
    if violations:
        raise ValueError(
            "the engine pod would break the restricted Pod Security Standard: "
            + "; ".join(violations)
        )


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or ()


def _container_violations(c: Mapping[str, Any], pod_context: Mapping[str, Any]) -> list[str]:
    where = f"container {c.get('name')!r}"
    sc: Mapping[str, Any] = c.get("securityContext") or {}
    out = _context_violations(where, sc)
    if sc.get("privileged"):
        out.append(f"{where} is privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where} does not set allowPrivilegeEscalation: false")
    caps: Mapping[str, Any] = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or ()):
        out.append(f"{where} does not drop ALL capabilities")
    added = sorted(set(caps.get("add") or ()) - ADDABLE_CAPABILITIES)
    if added:
        out.append(f"{where} adds capabilities {', '.join(added)}")
    if sc.get("procMount", "Default") != "Default":
        out.append(f"{where} has procMount {sc['procMount']}")
    # A container's own setting wins over the pod's; either way it must come out right.
    if sc.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
        out.append(f"{where} may run as root (runAsNonRoot is not true)")
    seccomp = sc.get("seccompProfile") or pod_context.get("seccompProfile") or {}
    if seccomp.get("type") not in CONFINED:
        out.append(f"{where} has no RuntimeDefault or Localhost seccomp profile")
    for port in c.get("ports") or ():
        if port.get("hostPort"):
            out.append(f"{where} uses hostPort {port['hostPort']}")
    return out


def _context_violations(where: str, sc: Mapping[str, Any]) -> list[str]:
    """The rules a pod's and a container's securityContext share."""
    out = []
    if sc.get("runAsUser") == 0:
        out.append(f"{where} runs as user 0")
    selinux: Mapping[str, Any] = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        out.append(f"{where} sets SELinux options beyond a container type")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in CONFINED:
        out.append(f"{where} has seccomp profile {seccomp}")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in CONFINED:
        out.append(f"{where} has AppArmor profile {apparmor}")
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{where} is a Windows host process")
    return out


def _json_type(kind: type) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer"}
    return names[kind]
