"""Engines in Kubernetes: the ready endpoints of the engine Service's EndpointSlices.

Read with the official `kubernetes` client (in-cluster config in a pod, else the local
kubeconfig) on every pool poll, in a thread (the client is synchronous). Only endpoints whose
`ready` condition is true are returned, so a pod that is terminating or failing its readiness
probe stops getting new sessions before it goes; its paused sessions fall back to recompute.

Engines the operator is draining carry the pod label `interlude.dev/draining=true`; their
endpoints stay in the pool (their paused sessions resume there) but are reported by
`draining()`, and the pool sends them no new session. Reading the labels takes a `list pods`
in the namespace; without that permission no engine is known to drain (logged once).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from interlude.api.cluster import DRAINING_LABEL

log = logging.getLogger(__name__)


class EndpointSliceDiscovery:
    """`urls()`: http://<address>:<port> of the ready endpoints of `namespace/service`.

    Side effects: two Kubernetes API list calls per `urls()` (EndpointSlices, and the pods
    labelled as draining). `extra` (static URLs) is added, for engines outside the cluster.
    `api` and `pods_api` stand in for the DiscoveryV1 and CoreV1 clients in tests.
    """

    def __init__(
        self,
        namespace: str,
        service: str,
        port: int,
        extra: tuple[str, ...] = (),
        api: Any = None,
        pods_api: Any = None,
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.port = port
        self.extra = extra
        self._api = api
        self._pods_api = pods_api
        self._draining: frozenset[str] = frozenset()
        self._pods_denied = False

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
            self._api = client.DiscoveryV1Api()
            self._pods_api = self._pods_api or client.CoreV1Api()
        return self._api

    def _draining_pods(self) -> set[str]:
        if self._pods_api is None or self._pods_denied:
            return set()
        from kubernetes.client.exceptions import ApiException

        try:
            pods = self._pods_api.list_namespaced_pod(
                self.namespace, label_selector=f"{DRAINING_LABEL}=true"
            )
        except ApiException as exc:
            if exc.status != 403:
                raise
            log.warning("cannot list pods in %s: draining engines are not seen", self.namespace)
            self._pods_denied = True
            return set()
        return {p.metadata.name for p in pods.items}

    def _list(self) -> tuple[list[str], frozenset[str]]:
        slices = self._client().list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}"
        )
        draining_pods = self._draining_pods()
        urls: list[str] = []
        draining: set[str] = set()
        for s in slices.items:
            for ep in s.endpoints or ():
                ready = ep.conditions is None or ep.conditions.ready is not False
                if ready:
                    found = [f"http://{addr}:{self.port}" for addr in ep.addresses or ()]
                    urls += found
                    ref = ep.target_ref
                    if ref is not None and ref.kind == "Pod" and ref.name in draining_pods:
                        draining.update(found)
        return sorted(set(urls)), frozenset(draining)

    async def urls(self) -> list[str]:
        urls, self._draining = await asyncio.to_thread(self._list)
        return [*urls, *self.extra]

    def draining(self) -> frozenset[str]:
        """The URLs of the last `urls()` whose engines are being drained."""
        return self._draining
