{{/*
The engine's model, by source. Weights are never fetched by the engine itself (it runs with
HF_HUB_OFFLINE=1): `hf` downloads them in an init container first, so a slow or failed download
shows as Init, not as an engine that never gets ready.
*/}}

{{/* The --model argument. */}}
{{- define "interlude.engine.modelArg" -}}
{{- $m := .Values.engine.model }}
{{- if eq $m.source "tiny" }}tiny
{{- else if eq $m.source "image" }}{{ required "engine.model.source=image needs engine.model.path (the model directory inside the image)" $m.path }}
{{- else if eq $m.source "pvc" }}{{ trimSuffix "/" (printf "/models/%s" (trimPrefix "/" $m.path)) }}
{{- else if eq $m.source "hf" }}/models/{{ required "engine.model.source=hf needs engine.model.hf.repo" $m.hf.repo }}
{{- else }}{{ fail (printf "engine.model.source must be tiny, image, pvc or hf, not %q" $m.source) }}
{{- end }}
{{- end }}

{{/* The model's name in the API: explicit, else the hub repo id, else the engine's default. */}}
{{- define "interlude.engine.servedName" -}}
{{- $m := .Values.engine.model }}
{{- if $m.servedName }}{{ $m.servedName }}
{{- else if eq $m.source "hf" }}{{ $m.hf.repo }}
{{- end }}
{{- end }}

{{/* Volumes holding the model (pvc and hf only). */}}
{{- define "interlude.engine.modelVolumes" -}}
{{- $m := .Values.engine.model }}
{{- if eq $m.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "engine.model.source=pvc needs engine.model.pvcClaimName" $m.pvcClaimName }}
    readOnly: true
{{- else if eq $m.source "hf" }}
- name: model
  {{- if $m.hf.cacheClaimName }}
  persistentVolumeClaim:
    claimName: {{ $m.hf.cacheClaimName }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ $m.hf.cacheSizeLimit }}
  {{- end }}
{{- end }}
{{- end }}

{{- define "interlude.engine.modelMounts" -}}
{{- $m := .Values.engine.model }}
{{- if has $m.source (list "pvc" "hf") }}
- name: model
  mountPath: /models
  readOnly: true
{{- end }}
{{- end }}

{{/*
source=hf: download into /models/<repo> before the engine starts. snapshot_download skips files
already there, so a cache PVC makes restarts and new replicas cheap. The repo and patterns go
in as environment variables, never into the Python source, so no value can inject code.
*/}}
{{- define "interlude.engine.initContainers" -}}
{{- $e := .Values.engine }}
{{- $m := $e.model }}
{{- if eq $m.source "hf" }}
- name: download-model
  image: {{ include "interlude.image" (dict "ctx" . "image" $e.image "suffix" (ternary "-gpu" "" (gt (int $e.gpus) 0))) }}
  imagePullPolicy: {{ include "interlude.pullPolicy" (dict "ctx" . "image" $e.image) }}
  command: [python, -c]
  args:
    - |
      import json, os
      from huggingface_hub import snapshot_download
      path = snapshot_download(
          os.environ["MODEL_REPO"],
          revision=os.environ["MODEL_REVISION"],
          local_dir=os.environ["MODEL_DIR"],
          ignore_patterns=json.loads(os.environ["MODEL_IGNORE"]) or None,
      )
      print("model ready at", path)
  env:
    - {name: MODEL_REPO, value: {{ $m.hf.repo | quote }}}
    - {name: MODEL_REVISION, value: {{ $m.hf.revision | quote }}}
    - {name: MODEL_DIR, value: {{ include "interlude.engine.modelArg" . | quote }}}
    - {name: MODEL_IGNORE, value: {{ toJson $m.hf.ignorePatterns | quote }}}
    - {name: HF_HUB_OFFLINE, value: "0"}
    - {name: HF_HOME, value: /cache/huggingface}
    - {name: HOME, value: /cache}
    {{- if $m.hf.tokenSecret }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $m.hf.tokenSecret }}
          key: {{ $m.hf.tokenSecretKey }}
    {{- end }}
  resources:
    requests: {cpu: 500m, memory: 1Gi}
    limits: {memory: 4Gi}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - {name: model, mountPath: /models}
    - {name: cache, mountPath: /cache}
    - {name: tmp, mountPath: /tmp}
{{- end }}
{{- end }}

{{/* The engine container's environment (the EnginePool hands the same list to the operator). */}}
{{- define "interlude.engine.env" -}}
{{- $e := .Values.engine }}
{{ include "interlude.commonEnv" . }}
{{ include "interlude.redisEnv" (dict "ctx" . "user" "engine") }}
{{- with include "interlude.gatewayTokenEnv" . }}
{{ . }}
{{- end }}
# The engine's name on the tool bus: a restarted container reads the results that
# arrived for its pod meanwhile.
- name: INTERLUDE_ENGINE_ID
  value: $(POD_NAME)
- name: INTERLUDE_TOOL_DEADLINE_S
  value: {{ $e.toolDeadlineSeconds | quote }}
# The root filesystem is read-only: every cache goes to the /cache emptyDir.
- {name: HOME, value: /cache}
- {name: XDG_CACHE_HOME, value: /cache}
- {name: HF_HOME, value: /cache/huggingface}
- {name: INTERLUDE_MODEL_CACHE, value: /cache/models}
- {name: VLLM_NO_USAGE_STATS, value: "1"}
{{- with $e.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
