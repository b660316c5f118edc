"""What stands in for a cluster in the operator's tests, and what does not.

Real: kopf, the operator, a Prometheus server (Debian's `prometheus`), HTTP servers that export
the engine's metric names in Prometheus's text format, and the HTTP between all of them.
Emulated: the Kubernetes API (kmock's `KubernetesEmulator`, plus `generateName`, `uid` and
`creationTimestamp`, which a real API server fills in) and the ReplicaSet controller, which
here creates a pod per replica, each with its own engine metrics server on a loopback
address, and on scale-down removes the pod with the lowest deletion cost first, as
Kubernetes does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import jsonpatch
import kmock
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from interlude_operator.pods import DELETION_COST

_VERSIONS = itertools.count(1)
# The engines' loopback addresses, one per engine, taken in turn (Prometheus scrapes them all).
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 42)]
_NEXT_ADDRESS = itertools.cycle(ADDRESSES)


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what a real API server does that kopf and the operator rely on:
    `generateName`, `uid` and `creationTimestamp` on create, a new `resourceVersion` on every
    write, a 409 Conflict for a patch that sets a `resourceVersion` no longer the object's
    (optimistic concurrency), and a 422 (not a 500) when a JSON patch's `test` of it fails.

    `interpose(resource, name, patch)` stands in for another writer: the next write to that
    object finds `patch` applied first, as if it had landed between the writer's read and its
    write (no watch event is sent for it: only the operator's own reads see it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.interposed: dict[tuple[str, str], dict[str, Any]] = {}
        self.conflicts: list[str] = []  # "plural/name" of every write answered 409

    def interpose(self, resource: str, name: str, patch: dict[str, Any]) -> None:
        self.interposed[resource, name] = patch

    async def _handle(self, request: kmock.Request) -> Any:
        version = str(next(_VERSIONS))
        data = request.data
        if request.action == kmock.action.UPDATE and request.name:
            self._precondition(request, data)
        if request.action == kmock.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["resourceVersion"] = version
        elif request.action == kmock.action.UPDATE and isinstance(data, dict):
            data.setdefault("metadata", {})["resourceVersion"] = version
        elif request.action == kmock.action.UPDATE and isinstance(data, list):
            data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # What a real API server answers when a patch's test op fails (kopf re-reads then).
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc

    def _precondition(self, request: kmock.Request, data: Any) -> None:
        """Another writer's interposed change first, then the patch's resourceVersion check."""
        res, name = request.resource, request.name
        if res is None or name is None:
            return
        try:
            stored = self.objects[res, request.namespace, name]
        except KeyError:
            return
        for resource, target in list(self.interposed):
            if kmock.resource(resource) == res and target == name:
                other = self.interposed.pop((resource, target))
                meta = {**other.get("metadata", {}), "resourceVersion": str(next(_VERSIONS))}
                stored.patch({**other, "metadata": meta})
        sent = _version_sent(data)
        current = str(stored.get("metadata", {}).get("resourceVersion", ""))
        if sent is not None and sent != current:
            self.conflicts.append(f"{res.plural}/{name}")
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"Operation cannot be fulfilled on {name}: the object has been "
                "modified; please apply your changes to the latest version and try again",
            )


def _version_sent(data: Any) -> str | None:
    """The resourceVersion a merge patch or a JSON patch sets, if it sets one."""
    if isinstance(data, dict):
        version = data.get("metadata", {}).get("resourceVersion")
        return None if version is None else str(version)
    for op in data if isinstance(data, list) else ():
        if op.get("path") == "/metadata/resourceVersion" and op.get("op") in ("add", "replace"):
            return str(op["value"])
    return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class FakeEngine:
    """One engine's `/metrics`: the names the engine exports, values the test sets; and for
    pools with roles its `/v1/load` (role, queued prefill tokens, running, busy share, sessions) and
    `PUT /v1/role`, which sets `role` and is remembered in `role_calls`.

    Side effects: a threaded HTTP server on `ip:port` until `stop`.
    """

    def __init__(self, ip: str, port: int, namespace: str, pod: str, **values: Any) -> None:
        self.ip, self.port = ip, port
        # As a Kubernetes scrape config would attach them; Prometheus honours them here.
        self.labels = {"namespace": namespace, "pod": pod}
        self.kv = 0.0
        self.waiting = 0.0
        # Sessions parked at a tool call, in vLLM's queue too: None exports no reasons (an
        # older vLLM); a number exports `..._by_reason` and adds them to the whole queue.
        self.parked: float | None = None
        self.sessions: dict[str, int] = {}
        self.pool_gb = 10.0
        self.role = "mixed"
        self.queued_prefill_tokens = 0
        self.running = 0
        self.busy_share = 0.0
        self.role_calls: list[str] = []
        self._rate = 0.0  # contended GB x s per s
        self._total = 0.0
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self.set(**values)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        self.server = _MetricsServer((ip, port), _engine_handler(registry, self))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, **values: Any) -> None:
        with self._lock:
            now = time.monotonic()
            self._total += self._rate * (now - self._since)
            self._since = now
            if "contended_rate" in values:  # GB x s per s from now on
                self._rate = float(values.pop("contended_rate"))
            if "contended_total" in values:  # the counter's value now
                self._total = float(values.pop("contended_total"))
            for key, value in values.items():
                if not hasattr(self, key):
                    raise AttributeError(key)
                setattr(self, key, value)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            total = self._total + self._rate * (time.monotonic() - self._since)
            kv, waiting, sessions, pool = self.kv, self.waiting, dict(self.sessions), self.pool_gb
            parked = self.parked
        names, values = list(self.labels), list(self.labels.values())
        for name, text, value in (
            ("vllm:kv_cache_usage_perc", "KV-cache usage", kv),
            ("vllm:num_requests_waiting", "Requests waiting", waiting + (parked or 0.0)),
            ("interlude:kv_pool_gb", "KV pool GB", pool),
        ):
            gauge = GaugeMetricFamily(name, text, labels=[*names, "model_name"])
            gauge.add_metric([*values, "tiny"], value)
            yield gauge
        if parked is not None:
            gauge = GaugeMetricFamily(
                "vllm:num_requests_waiting_by_reason",
                "Waiting requests by reason",
                labels=[*names, "model_name", "reason"],
            )
            gauge.add_metric([*values, "tiny", "capacity"], waiting)
            gauge.add_metric([*values, "tiny", "deferred"], parked)
            yield gauge
        gauge = GaugeMetricFamily(
            "interlude:sessions", "Sessions by state", labels=[*names, "state"]
        )
        for state, n in sessions.items():
            gauge.add_metric([*values, state], n)
        yield gauge
        counter = CounterMetricFamily(
            "interlude:kv_waste_contended_gb_seconds", "Contended waste", labels=names
        )
        counter.add_metric(values, total)
        yield counter

    def load(self) -> dict[str, Any]:
        """As the engine's `GET /v1/load` reports it (the fields the operator reads)."""
        with self._lock:
            return {
                "role": self.role,
                "queued_prefill_tokens": self.queued_prefill_tokens,
                "running": self.running,
                "busy_share": self.busy_share,
                "waiting": int(self.waiting),
                "max_num_seqs": 8,
                "sessions": dict(self.sessions),
            }

    def take_role(self, role: str) -> None:
        with self._lock:
            self.role = role
            self.role_calls.append(role)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _engine_handler(
    registry: CollectorRegistry, engine: FakeEngine
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Like the engine's own GET /metrics (engine/server.py): the classic text format
        # whatever the scraper accepts. (prometheus_client's start_http_server would answer
        # Prometheus in OpenMetrics, which spells `vllm:x` as `vllm_x`.)
        def do_GET(self) -> None:
            if self.path == "/v1/load":
                self._send(json.dumps(engine.load()).encode(), "application/json")
                return
            self._send(generate_latest(registry), CONTENT_TYPE_LATEST)

        def do_PUT(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/role" or body.get("role") not in ("mixed", "prefill", "decode"):
                self._send(b"{}", "application/json", 400)
                return
            engine.take_role(body["role"])
            self._send(json.dumps({"role": body["role"]}).encode(), "application/json")

        def _send(self, body: bytes, content_type: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


class ReplicaSets:
    """The ReplicaSet controller, reduced to what the operator relies on: as many pods as the
    Deployment's replicas, each running a `FakeEngine`; on scale-down the pod with the lowest
    `pod-deletion-cost` goes first (then the youngest); a deleted pod is replaced.

    Side effects: pods created and deleted through the emulator's HTTP API, engine servers
    started and stopped.
    """

    def __init__(self, url: str, namespace: str, port: int) -> None:
        self.url, self.namespace, self.port = url.rstrip("/"), namespace, port
        self.engines: dict[str, FakeEngine] = {}
        self.load: dict[str, Any] = {}  # the values every new engine starts with
        self.created: list[str] = []
        self.deleted: list[str] = []

    async def run(self, deployment: str, interval_s: float = 0.1) -> None:
        async with aiohttp.ClientSession(self.url) as http:
            while True:
                await self.step(http, deployment)
                await asyncio.sleep(interval_s)

    async def step(self, http: aiohttp.ClientSession, deployment: str) -> None:
        async with http.get(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{deployment}"
        ) as r:
            if r.status != 200:
                return
            dep = await r.json()
        selector = dep["spec"]["selector"]["matchLabels"]
        async with http.get(f"/api/v1/namespaces/{self.namespace}/pods") as r:
            items = (await r.json())["items"]
        pods = [
            p
            for p in items
            if all(p["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
            and not p["metadata"].get("deletionTimestamp")
        ]
        names = {p["metadata"]["name"] for p in pods}
        for gone in set(self.engines) - names:
            self.engines.pop(gone).stop()
            self.deleted.append(gone)
        want = int(dep["spec"]["replicas"])
        for _ in range(want - len(pods)):
            await self._create(http, dep)
        if len(pods) > want:
            pods.sort(key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)
            pods.sort(key=lambda p: int(p["metadata"].get("annotations", {}).get(DELETION_COST, 0)))
            for p in pods[: len(pods) - want]:
                name = p["metadata"]["name"]
                await http.delete(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    async def _create(self, http: aiohttp.ClientSession, dep: dict[str, Any]) -> None:
        template = dep["spec"]["template"]
        name = f"{dep['metadata']['name']}-{secrets.token_hex(3)}"
        ip = next(_NEXT_ADDRESS)
        self.engines[name] = FakeEngine(ip, self.port, self.namespace, name, **self.load)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": dict(template["metadata"].get("labels", {})),
                "annotations": dict(template["metadata"].get("annotations", {})),
            },
            "spec": template["spec"],
            "status": {
                "phase": "Running",
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        async with http.post(f"/api/v1/namespaces/{self.namespace}/pods", json=pod) as r:
            assert r.status < 300, await r.text()
        self.created.append(name)

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()
        self.engines.clear()
