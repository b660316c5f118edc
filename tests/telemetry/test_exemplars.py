"""Metrics link to traces: a measurement carries its trace id as an exemplar, and `/metrics`
speaks OpenMetrics (which carries exemplars) to a scraper that asks for it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from interlude import telemetry


def test_a_measurement_in_a_span_carries_its_trace_id_in_openmetrics_only() -> None:
    telemetry.setup_tracing("interlude-test")
    registry = CollectorRegistry()
    latency = Histogram("test_latency_seconds", "a latency", registry=registry)
    assert telemetry.exemplar() is None  # no span: no exemplar
    latency.observe(0.2, exemplar=telemetry.exemplar())
    with telemetry.tracer().start_as_current_span("request") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        assert telemetry.exemplar() == {"trace_id": trace_id}
        latency.observe(0.3, exemplar=telemetry.exemplar())
        carrier = telemetry.carrier_of(span)
    # Later, elsewhere (a tool worker's result): the carrier names the span.
    assert telemetry.exemplar(carrier) == {"trace_id": trace_id}

    body, kind = telemetry.exposition("application/openmetrics-text; version=1.0.0", registry)
    assert kind.startswith("application/openmetrics-text")
    text = body.decode()
    assert f'# {{trace_id="{trace_id}"}} 0.3' in text
    assert text.rstrip().endswith("# EOF")
    classic, kind = telemetry.exposition("text/plain", registry)
    assert kind.startswith("text/plain") and b"trace_id" not in classic
    assert b"test_latency_seconds_count 2.0" in classic
    assert telemetry.exposition(None, registry)[1] == kind
