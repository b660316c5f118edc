{{/*
Names the picker, its InferencePool and the HTTPRoute share. The keys Secret is the gateway's
(gateway.auth): one file of hashed keys for both paths, so a key names the same tenant on each.
*/}}

{{/* The InferencePool's name: inferencePool.name, else "<fullname>-inference-pool". */}}
{{- define "interlude.inferencePoolName" -}}
{{- .Values.inferencePool.name | default (include "interlude.componentName" (dict "ctx" . "component" "inference-pool")) }}
{{- end }}

{{/* The Secret holding the hashed API keys: gateway.auth.existingSecret, else the chart's. */}}
{{- define "interlude.apiKeysSecretName" -}}
{{- .Values.gateway.auth.existingSecret | default (printf "%s-keys" (include "interlude.componentName" (dict "ctx" . "component" "gateway"))) }}
{{- end }}

{{/* Non-empty when the picker reads the keys file (picker.auth.mode=keys). */}}
{{- define "interlude.picker.readsKeys" -}}
{{- if and .Values.picker.enabled (eq .Values.picker.auth.mode "keys") }}true{{ end }}
{{- end }}
