"""Engines in Kubernetes: the ready endpoints of the engine Service's EndpointSlices.

Read with the official `kubernetes` client (in-cluster config in a pod, else the local
kubeconfig) on every pool poll, in a thread (the client is synchronous). Only endpoints whose
`ready` condition is true are returned, so a pod that is terminating or failing its readiness
probe stops getting new sessions before it goes; its paused sessions fall back to recompute.
"""

from __future__ import annotations

import asyncio
from typing import Any


class EndpointSliceDiscovery:
    """`urls()`: http://<address>:<port> of the ready endpoints of `namespace/service`.

    Side effects: one Kubernetes API list call per `urls()`. `extra` (static URLs) is added,
    for engines outside the cluster.
    """

    def __init__(
        self, namespace: str, service: str, port: int, extra: tuple[str, ...] = (), api: Any = None
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.port = port
        self.extra = extra
        self._api = api

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
            self._api = client.DiscoveryV1Api()
        return self._api

    def _list(self) -> list[str]:
        slices = self._client().list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}"
        )
        urls = []
        for s in slices.items:
            for ep in s.endpoints or ():
                ready = ep.conditions is None or ep.conditions.ready is not False
                if ready:
                    urls += [f"http://{addr}:{self.port}" for addr in ep.addresses or ()]
        return sorted(set(urls))

    async def urls(self) -> list[str]:
        return [*await asyncio.to_thread(self._list), *self.extra]
