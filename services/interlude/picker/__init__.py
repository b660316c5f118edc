"""The endpoint picker: Interlude's engine choice behind a Gateway API `InferencePool`.

A cluster that runs a Gateway API implementation with the Inference Extension (Istio, kgateway,
Envoy Gateway, GKE) routes an `HTTPRoute` to an `InferencePool`, and its Envoy asks the pool's
endpoint picker, over Envoy's `ext_proc` gRPC protocol, which engine each request goes to. This
package is that picker (`interlude picker`): the same choice as Interlude's own gateway
(`gateway.placement`) — a continuation to the engine holding its paused session, a new
conversation by power-of-two choices on KV, contended waste and queue — answered in the
endpoint-picker protocol (a destination header and `envoy.lb` metadata with fallbacks, 503 when
no engine is ready, 429 when shedding). The body is read once; responses pass untouched.

`config` the settings, `decide` the choice for one request, `protocol` the ext_proc messages,
`stream` one ext_proc stream, `server` the gRPC server with its health service, `metrics`.
"""
