{{- /*
Valkey's HA mode (redis.ha.enabled): the StatefulSet's pods are one primary and its replicas,
each pod with a Sentinel beside it; the components reach the primary through the sentinels
(redis+sentinel:// URLs, interlude.redisEnv), so a failover is followed. What the Valkey docs
describe for Sentinel, with the chart's ACL users:
  * a replica syncs as the `replication` user (masteruser/masterauth), a sentinel watches and
    reconfigures the nodes as the `sentinel` user (auth-user/auth-pass): interlude.bus.acl;
  * the sentinels' own `default` user, which every component reaches without a password, may
    only ask where the primary is (and ping): no SENTINEL SET, FAILOVER or REMOVE from a tool
    pod. Sentinels talk to each other as their `sentinel` user.
  * names, not addresses (resolve-hostnames, announce-hostnames): a pod keeps its name across
    restarts, not its IP. The headless Service publishes not-ready pods so a starting pod can
    name the others.
Each container asks the sentinels where the primary is when it starts (a restarted pod rejoins
as a replica of whoever won the failover); when none answers (the first install, or every pod
restarted at once), pod 0 is the primary, with its append-only file.
*/}}

{{- define "interlude.redis.haEnabled" -}}
{{- if and .Values.redis.enabled .Values.redis.ha.enabled }}true{{ end }}
{{- end }}

{{/* Pod i's name in the headless Service (resolvable from the release's namespace). */}}
{{- define "interlude.redis.nodes" -}}
{{- $name := include "interlude.componentName" (dict "ctx" . "component" "redis") }}
{{- $nodes := list }}
{{- range $i := until (int .Values.redis.ha.replicas) }}
{{- $nodes = append $nodes (printf "%s-%d.%s" $name $i $name) }}
{{- end }}
{{- toJson $nodes }}
{{- end }}

{{/* host:26379 of every sentinel, comma-separated (a redis+sentinel:// URL's host list). */}}
{{- define "interlude.redis.sentinels" -}}
{{- $hosts := list }}
{{- range include "interlude.redis.nodes" . | fromJsonArray }}
{{- $hosts = append $hosts (printf "%s:26379" .) }}
{{- end }}
{{- join "," $hosts }}
{{- end }}

{{- /*
Shell: set $me (this pod's name) and $primary (where the primary is: the first sentinel that
answers, else pod 0; empty when that is this pod).
*/}}
{{- define "interlude.redis.findPrimary" -}}
{{- $nodes := include "interlude.redis.nodes" . | fromJsonArray }}
me="$POD_NAME.{{ include "interlude.componentName" (dict "ctx" . "component" "redis") }}"
primary=""
for node in {{ join " " $nodes }}; do
  primary=$(timeout 3 valkey-cli -h "$node" -p 26379 --raw sentinel get-master-addr-by-name {{ .Values.redis.ha.masterSet }} 2>/dev/null | head -n 1) || primary=""
  # Only one of the set's names is an answer (not an error message, not an empty reply).
  case "$primary" in *.{{ include "interlude.componentName" (dict "ctx" . "component" "redis") }}) break ;; *) primary="" ;; esac
done
if [ -z "$primary" ]; then
  primary={{ first $nodes }}
  echo "no sentinel answered: $primary is the primary"
else
  echo "the sentinels name $primary as the primary"
fi
[ "$primary" = "$me" ] && primary=""
{{- end }}

{{- /* The Valkey container's start in HA mode: its config, then as primary or replica. */}}
{{- define "interlude.redis.haStart" -}}
set -eu
umask 077
{{ include "interlude.redis.findPrimary" . }}
conf=/run/valkey/valkey.conf
{
  echo "include /etc/valkey/valkey.conf"
  echo "replica-announce-ip $me"
  echo "masteruser replication"
  echo "masterauth $REPLICATION_PASSWORD"
  if [ -n "$primary" ]; then echo "replicaof $primary 6379"; fi
} > "$conf"
exec valkey-server "$conf"
{{- end }}

{{- /*
The Sentinel container's start: the config from the ConfigMap, its placeholders filled in. A
restarted container (same pod) keeps the file Sentinel has rewritten with what it learnt.
*/}}
{{- define "interlude.redis.sentinelStart" -}}
set -eu
umask 077
conf=/run/sentinel/sentinel.conf
if [ ! -f "$conf" ]; then
{{ include "interlude.redis.findPrimary" . | indent 2 }}
  [ -z "$primary" ] && primary="$me"
  hash=$(printf '%s' "$SENTINEL_PASSWORD" | sha256sum | cut -d ' ' -f 1)
  sed -e "s|@PRIMARY@|$primary|" -e "s|@ANNOUNCE@|$me|" -e "s|@SENTINEL_HASH@|$hash|" \
    -e "s|@SENTINEL_PASSWORD@|$SENTINEL_PASSWORD|" /etc/valkey/sentinel.conf > "$conf"
fi
exec valkey-server "$conf" --sentinel
{{- end }}

{{- /*
sentinel.conf with placeholders: @PRIMARY@ and @ANNOUNCE@ (host names), @SENTINEL_PASSWORD@ and
@SENTINEL_HASH@ (its SHA-256), filled in by interlude.redis.sentinelStart.
*/}}
{{- define "interlude.redis.sentinelConf" -}}
{{- $h := .Values.redis.ha }}
{{- $set := $h.masterSet }}
port 26379
dir /run/sentinel
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip @ANNOUNCE@
sentinel monitor {{ $set }} @PRIMARY@ 6379 {{ $h.quorum }}
sentinel down-after-milliseconds {{ $set }} {{ $h.downAfterMilliseconds }}
sentinel failover-timeout {{ $set }} {{ $h.failoverTimeout }}
sentinel parallel-syncs {{ $set }} 1
sentinel auth-user {{ $set }} sentinel
sentinel auth-pass {{ $set }} @SENTINEL_PASSWORD@
sentinel sentinel-user sentinel
sentinel sentinel-pass @SENTINEL_PASSWORD@
user default on nopass resetchannels -@all {{ include "interlude.redis.sentinelClientRules" . }}
user sentinel on #@SENTINEL_HASH@ ~* &* +@all
{{- end }}

{{- /*
What a client may ask a sentinel without a password: redis-py's Sentinel (SENTINEL MASTERS,
and REPLICAS for a replica pool), limits' storage, valkey-cli's GET-MASTER-ADDR-BY-NAME above.
*/}}
{{- define "interlude.redis.sentinelClientRules" -}}
+ping +client|setinfo +client|setname +sentinel|masters +sentinel|master +sentinel|get-master-addr-by-name +sentinel|replicas +sentinel|slaves +sentinel|sentinels
{{- end }}

{{- define "interlude.redis.sentinelContainer" -}}
{{- $r := .Values.redis }}
- name: sentinel
  image: "{{ $r.image.repository }}:{{ $r.image.tag }}"
  imagePullPolicy: {{ $r.image.pullPolicy }}
  command: [sh, -c, {{ include "interlude.redis.sentinelStart" . | quote }}]
  env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: SENTINEL_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ include "interlude.redisSecretName" . }}
          key: {{ include "interlude.redisPasswordKey" (dict "ctx" . "user" "sentinel") }}
  ports:
    - name: sentinel
      containerPort: 26379
      protocol: TCP
  readinessProbe:
    exec:
      command: [sh, -c, "valkey-cli -p 26379 ping | grep -q PONG"]
    periodSeconds: 5
    timeoutSeconds: 3
  livenessProbe:
    tcpSocket: {port: sentinel}
    periodSeconds: 10
    failureThreshold: 6
  resources:
    {{- toYaml $r.ha.sentinelResources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - {name: config, mountPath: /etc/valkey, readOnly: true}
    - {name: sentinel-run, mountPath: /run/sentinel}
{{- end }}
