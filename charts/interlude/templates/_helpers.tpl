{{/*
Names, labels, images and the Redis wiring every component shares.
Selectors use only interlude.selectorLabels (name, instance, component): they never change across
upgrades, because a Deployment's or StatefulSet's selector is immutable.
*/}}

{{- define "interlude.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The resource name prefix; component names append to it, so keep room for the suffix. */}}
{{- define "interlude.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<component>": call with (dict "ctx" $ "component" "engine"). */}}
{{- define "interlude.componentName" -}}
{{- printf "%s-%s" (include "interlude.fullname" .ctx) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "interlude.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Immutable: the only labels selectors may use. Call with (dict "ctx" $ "component" "x"). */}}
{{- define "interlude.selectorLabels" -}}
app.kubernetes.io/name: {{ include "interlude.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Selector labels plus the ones that change with versions (never used to select). */}}
{{- define "interlude.labels" -}}
{{ include "interlude.selectorLabels" . }}
app.kubernetes.io/part-of: interlude
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "interlude.chart" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels without a component, for resources that belong to the whole release. */}}
{{- define "interlude.releaseLabels" -}}
app.kubernetes.io/name: {{ include "interlude.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: interlude
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "interlude.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
"repository:tag" of a component: (dict "ctx" $ "image" .Values.x.image "suffix" "-gpu").
An empty tag falls back to the shared tag, then appVersion; the suffix picks an image flavour.
*/}}
{{- define "interlude.image" -}}
{{- $shared := .ctx.Values.image }}
{{- $repo := .image.repository | default $shared.repository }}
{{- $tag := .image.tag }}
{{- if not $tag }}
{{- $tag = printf "%s%s" ($shared.tag | default .ctx.Chart.AppVersion) (.suffix | default "") }}
{{- end }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{- define "interlude.pullPolicy" -}}
{{- .image.pullPolicy | default .ctx.Values.image.pullPolicy }}
{{- end }}

{{- define "interlude.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Redis: the chart's Valkey, or an external URL from a Secret; one must be there. */}}
{{- define "interlude.redisHost" -}}
{{- include "interlude.componentName" (dict "ctx" . "component" "redis") }}
{{- end }}

{{- define "interlude.redisSecretName" -}}
{{- .Values.redis.existingSecret | default (include "interlude.componentName" (dict "ctx" . "component" "redis")) }}
{{- end }}

{{/*
The key of an ACL user's password in the Redis Secret: (dict "ctx" $ "user" "engine"). The admin
("default") keeps the chart's one password of before; each component has "<user>-password".
*/}}
{{- define "interlude.redisPasswordKey" -}}
{{- if ne .user "default" }}{{ .user }}-password
{{- else if .ctx.Values.redis.existingSecret }}{{ .ctx.Values.redis.existingSecretKey }}
{{- else }}password{{ end }}
{{- end }}

{{/*
Env entries that set INTERLUDE_REDIS_URL: (dict "ctx" $ "user" "engine"). With the chart's Valkey
the component connects as its own ACL user (interlude.bus.acl), the URL assembled from the
Secret by Kubernetes' $(VAR) expansion, so the password never sits in a manifest; in HA mode
(redis.ha) the URL lists every pod's sentinel.
*/}}
{{- define "interlude.redisEnv" -}}
{{- $v := .ctx.Values }}
{{- if $v.redis.enabled }}
- name: INTERLUDE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "interlude.redisSecretName" .ctx }}
      key: {{ include "interlude.redisPasswordKey" . }}
{{- if $v.redis.ha.enabled }}
{{- /* Through the sentinels, which name the primary now: a failover is followed. */}}
- name: INTERLUDE_REDIS_URL
  value: "redis+sentinel://{{ .user }}:$(INTERLUDE_REDIS_PASSWORD)@{{ include "interlude.redis.sentinels" .ctx }}/{{ $v.redis.ha.masterSet }}/0"
{{- else }}
- name: INTERLUDE_REDIS_URL
  value: "redis://{{ .user }}:$(INTERLUDE_REDIS_PASSWORD)@{{ include "interlude.redisHost" .ctx }}:6379/0"
{{- end }}
{{- else }}
- name: INTERLUDE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.enabled is false: set externalRedis.existingSecret (a Secret with the redis:// URL)" $v.externalRedis.existingSecret }}
      key: {{ $v.externalRedis.existingSecretKey }}
{{- end }}
{{- end }}

{{/* The gateway token's Secret: the one named, else the chart's. */}}
{{- define "interlude.gatewayTokenSecretName" -}}
{{- .Values.gatewayToken.existingSecret | default (include "interlude.componentName" (dict "ctx" . "component" "gateway-token")) }}
{{- end }}

{{- define "interlude.gatewayTokenSecretKey" -}}
{{- if .Values.gatewayToken.existingSecret }}{{ .Values.gatewayToken.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{/*
Env entry INTERLUDE_GATEWAY_TOKEN (gatewayToken.enabled): the secret the gateway sends the
engines beside each caller's tenant (header x-interlude-gateway-token); an engine with a token
believes the tenant header only with it. Gateway and engines read the same Secret.
*/}}
{{- define "interlude.gatewayTokenEnv" -}}
{{- if .Values.gatewayToken.enabled }}
- name: INTERLUDE_GATEWAY_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "interlude.gatewayTokenSecretName" . }}
      key: {{ include "interlude.gatewayTokenSecretKey" . }}
{{- end }}
{{- end }}

{{/*
The pods' OTLP/HTTP endpoint: the value, else the chart's collector when it runs, else the
chart's Tempo (which takes OTLP itself), else none.
*/}}
{{- define "interlude.otlpEndpoint" -}}
{{- if .Values.tracing.otlpEndpoint }}
{{- .Values.tracing.otlpEndpoint }}
{{- else if .Values.tracing.collector.enabled }}
{{- printf "http://%s:4318" (include "interlude.componentName" (dict "ctx" . "component" "otel-collector")) }}
{{- else if .Values.tempo.enabled }}
{{- printf "http://%s:4318" (include "interlude.tempoHost" .) }}
{{- end }}
{{- end }}

{{/* The chart's Tempo Service (call only when tempo.enabled). */}}
{{- define "interlude.tempoHost" -}}
{{- include "interlude.componentName" (dict "ctx" . "component" "tempo") }}
{{- end }}

{{/* Where the collector sends spans (OTLP/gRPC host:port): the chart's Tempo, else the value. */}}
{{- define "interlude.collectorTempoEndpoint" -}}
{{- if .Values.tempo.enabled }}
{{- printf "%s:4317" (include "interlude.tempoHost" .) }}
{{- else }}
{{- .Values.tracing.collector.tempoEndpoint }}
{{- end }}
{{- end }}

{{/* Tempo's HTTP API for Grafana: the value, else the chart's Tempo, else none. */}}
{{- define "interlude.tempoUrl" -}}
{{- if .Values.monitoring.grafanaDatasources.tempoUrl }}
{{- .Values.monitoring.grafanaDatasources.tempoUrl }}
{{- else if .Values.tempo.enabled }}
{{- printf "http://%s.%s.svc:3200" (include "interlude.tempoHost" .) .Release.Namespace }}
{{- end }}
{{- end }}

{{/* Env shared by every Interlude container: traces and the pod's identity. */}}
{{- define "interlude.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- with include "interlude.otlpEndpoint" . }}
- name: INTERLUDE_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Pod annotations: the values' own plus, if asked, the classic Prometheus scrape ones. */}}
{{- define "interlude.podAnnotations" -}}
{{- with .annotations }}
{{ toYaml . }}
{{- end }}
{{- if and .ctx.Values.monitoring.scrapeAnnotations .port }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* Scheduling fields a component may set: (dict "v" .Values.gateway). */}}
{{- define "interlude.scheduling" -}}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
