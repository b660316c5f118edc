"""The few Kubernetes API calls the operator makes beyond kopf's own, over aiohttp.

kopf watches the EnginePools and posts the events; the Deployment, the pods and the pool's
status are read and written here, with the same credentials kopf logs in with (a service
account in a pod, else the kubeconfig). Patches are JSON merge patches unless a JSON patch
(a list of operations) is given.

A patch given the `resourceVersion` its writer read is conditional (optimistic concurrency):
the API server applies it only to that version and answers 409 Conflict when the object has
changed since, so a decision made on a stale read is retried on a fresh one instead of
overwriting what another writer (a controller, KEDA, a person, a second operator) wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import kopf

from interlude_operator import GROUP, PLURAL, VERSION

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# A JSON merge patch (a mapping) or a JSON patch (a list of operations).
Patch = Mapping[str, Any] | Sequence[Mapping[str, Any]]


class ApiError(RuntimeError):
    """A Kubernetes API call failed; `status` is the HTTP status (0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status

    @property
    def conflict(self) -> bool:
        """The object changed since the writer read it: read again and decide again."""
        return self.status == 409

    @property
    def transient(self) -> bool:
        """Worth retrying as is: no answer, a conflict, throttling or a server error."""
        return self.status in (0, 409, 429) or self.status >= 500


def login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """The operator's credentials: its service account in a pod, else the kubeconfig."""
    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("no service account and no kubeconfig to log in with")
    return info


class Kube:
    """Kubernetes API client for the operator's own reads and writes.

    Side effects: HTTP calls to the API server; owns an aiohttp session until `close`. On a
    401 the credentials are fetched again (a projected token rotates) and the call fails as
    a transient `ApiError` for the caller to retry.
    """

    def __init__(
        self, credentials: Callable[[], kopf.ConnectionInfo] = login, timeout_s: float = 10.0
    ) -> None:
        self.credentials = credentials
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._server = ""

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            info = self.credentials()
            ssl = info.as_ssl_context() if info.server.startswith("https://") else False
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl),
                headers=info.as_http_headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
            self._server = info.server.rstrip("/")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Patch | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """The JSON answer; None for a 404 (the object is not there)."""
        session = self._open()
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        try:
            async with session.request(
                method, self._server + path, data=data, params=params, headers=headers
            ) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(0, f"{method} {path}: {exc!r}") from exc
        if status == 404:
            return None
        if status == 401:
            await self.close()  # log in again on the next call
        if status >= 400:
            raise ApiError(status, f"{method} {path}: {_message(text)}")
        answer = json.loads(text) if text else {}
        return answer if isinstance(answer, dict) else {}

    async def get(self, path: str) -> dict[str, Any] | None:
        return await self.request("GET", path)

    async def list(self, path: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        answer = await self.request("GET", path, params={"labelSelector": selector})
        return list((answer or {}).get("items") or [])

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body) or {}

    async def patch(self, path: str, body: Patch, version: str = "") -> dict[str, Any] | None:
        """Patch; with `version` (the resourceVersion read), only that version of the object."""
        kind = JSON_PATCH if isinstance(body, Sequence) else MERGE
        return await self.request("PATCH", path, conditional(body, version), content_type=kind)

    async def delete(self, path: str) -> bool:
        """Whether the object was there to delete."""
        return await self.request("DELETE", path) is not None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def conditional(body: Patch, version: str) -> Patch:
    """The patch made conditional on the object's `resourceVersion` still being `version`
    (unchanged without one). The API server compares the version a patch sets with the
    stored one and answers 409 Conflict when they differ, for either kind of patch."""
    if not version:
        return body
    if isinstance(body, Sequence):
        op = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
        return [*body, op]
    meta = {**(body.get("metadata") or {}), "resourceVersion": version}
    return {**body, "metadata": meta}


def version_of(obj: Mapping[str, Any] | None) -> str:
    """An object's resourceVersion as the API server last returned it ("" if none)."""
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def pool_path(namespace: str, name: str, sub: str = "") -> str:
    tail = f"/{sub}" if sub else ""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}{tail}"


def deployment_path(namespace: str, name: str = "") -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments" + (f"/{name}" if name else "")


def pod_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def _message(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:300]
    return str(body.get("message", text[:300])) if isinstance(body, dict) else text[:300]
