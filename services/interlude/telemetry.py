"""OpenTelemetry for Interlude: one tracer, W3C trace context in and out.

Spans: the engine opens `session` (child of the caller's `traceparent`, if any), one `turn` per
generation turn and one `pause` per tool call; the pause's context travels in `ToolCall.trace`
so the tool pod's `tool` span joins the same trace. `setup_tracing` installs an SDK provider
exporting over OTLP/HTTP when an endpoint is configured (`INTERLUDE_OTLP_ENDPOINT`), and as
JSON lines into `<INTERLUDE_TRACE_DIR>/<service>.jsonl` when that is set (the one-machine mode,
which has no collector); without either, spans are still created (tests read them with an
in-memory exporter) but go nowhere.

Metrics link to traces by exemplars: latency histograms carry the `trace_id` of the request or
call they measured (`exemplar`), and `/metrics` answers in the OpenMetrics format, which carries
exemplars, when the scraper asks for it (`exposition`; Prometheus does, with exemplar storage on).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from interlude.env import load_env

TRACER_NAME = "interlude"
_provider: TracerProvider | None = None


def setup_tracing(
    service: str, endpoint: str = "", exporter: SpanExporter | None = None
) -> TracerProvider:
    """Install (once per process) the SDK tracer provider; later calls add exporters only.

    Side effects: sets the global tracer provider on first call. `endpoint` is an OTLP/HTTP
    base URL (e.g. ``http://otel-collector:4318``); `exporter` is for tests (in-memory).
    """
    global _provider
    if _provider is None:
        _provider = TracerProvider(resource=Resource.create({"service.name": service}))
        trace.set_tracer_provider(_provider)
    processors: list[SpanProcessor] = []
    trace_dir = load_env().trace_dir
    if trace_dir and exporter is None:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        os.makedirs(trace_dir, exist_ok=True)
        # Line-buffered: each span is one line, readable while the process still runs.
        out = open(os.path.join(trace_dir, f"{service}.jsonl"), "a", buffering=1)  # noqa: SIM115
        processors.append(
            BatchSpanProcessor(
                ConsoleSpanExporter(
                    out=out, formatter=lambda span: span.to_json(indent=None) + "\n"
                ),
                schedule_delay_millis=500,
            )
        )
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processors.append(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"))
        )
    if exporter is not None:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        # Simple (synchronous) so a test sees a span as soon as it ends.
        processors.append(SimpleSpanProcessor(exporter))
    for p in processors:
        _provider.add_span_processor(p)
    return _provider


def tracer() -> trace.Tracer:
    """This process's tracer. Cached per provider: `get_tracer` builds a new one on every call
    (a tenth of a tool call's CPU in the worker), and a provider set later gets its own."""
    provider = trace.get_tracer_provider()
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = (provider, trace.get_tracer(TRACER_NAME, tracer_provider=provider))
        _tracers[id(provider)] = cached
    return cached[1]


_tracers: dict[int, tuple[trace.TracerProvider, trace.Tracer]] = {}


def carrier_of(span: trace.Span) -> dict[str, str]:
    """The W3C trace context (`traceparent`, maybe `tracestate`) naming `span` as parent."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def context_of(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The parent context a carrier (HTTP headers, `ToolCall.trace`) names; None if none."""
    if not carrier:
        return None
    lowered = {k.lower(): v for k, v in carrier.items()}
    if "traceparent" not in lowered:
        return None
    return propagate.extract(lowered)


def exemplar(carrier: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The exemplar labels of a measurement: the trace id of the span `carrier` names, else of
    the current span; None when there is none (prometheus-client then records no exemplar)."""
    ctx = context_of(carrier) if carrier is not None else None
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid:
        return None
    return {"trace_id": format(span_context.trace_id, "032x")}


def exposition(accept: str | None, registry: CollectorRegistry = REGISTRY) -> tuple[bytes, str]:
    """(body, content type) of a `/metrics` answer: OpenMetrics, which carries exemplars, when
    the scraper's Accept header asks for it; Prometheus's classic text format otherwise."""
    if accept and "application/openmetrics-text" in accept:
        # prometheus-client leaves its OpenMetrics writer unannotated.
        body: bytes = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
        return body, openmetrics.CONTENT_TYPE_LATEST
    return generate_latest(registry), CONTENT_TYPE_LATEST


class ProbeHandler(BaseHTTPRequestHandler):
    """A handler for a side port's few GET routes (metrics, health): whole answers, no log
    line per request (a scrape or probe every few seconds would flood the log)."""

    def send_body(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_metrics(self) -> None:
        body, content_type = exposition(self.headers.get("Accept"))
        self.send_body(200, content_type, body)

    def not_found(self) -> None:
        self.send_body(404, "application/json", b'{"error": "not found"}')

    def log_message(self, format: str, *args: object) -> None:
        return


def serve_side_port(
    handler: type[ProbeHandler], port: int, host: str = "0.0.0.0", name: str = "side-http"
) -> ThreadingHTTPServer:
    """Serve `handler` on `port` from a daemon thread; `shutdown()` the result to stop."""
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def serve_metrics(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """`/metrics` alone on its own port: what Prometheus scrapes, apart from a public API."""

    class Handler(ProbeHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                self.send_metrics()
            else:
                self.not_found()

    return serve_side_port(Handler, port, host, "metrics-http")


def links_to(carrier: Mapping[str, str] | None) -> list[trace.Link]:
    """A link to the span a carrier names (none if it names none): a tool result's span
    points at the worker's span that produced it."""
    ctx = context_of(carrier)
    if ctx is None:
        return []
    span_context = trace.get_current_span(ctx).get_span_context()
    return [trace.Link(span_context)] if span_context.is_valid else []
