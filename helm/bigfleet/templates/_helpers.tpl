{{/*
Names, labels, addresses and the argument fragments shared by every workload.
Ports are fixed by the binaries' contract (docs/flags.md), so they are constants here, not values.
*/}}

{{- define "bigfleet.port.gateway" -}}7780{{- end -}}
{{- define "bigfleet.port.gatewayMetrics" -}}8781{{- end -}}
{{- define "bigfleet.port.decideMetrics" -}}8780{{- end -}}
{{- define "bigfleet.port.work" -}}7782{{- end -}}
{{- define "bigfleet.port.executeMetrics" -}}8782{{- end -}}
{{- define "bigfleet.port.coordinator" -}}7790{{- end -}}
{{- define "bigfleet.port.raft" -}}7791{{- end -}}
{{- define "bigfleet.port.coordinatorMetrics" -}}8790{{- end -}}
{{- define "bigfleet.port.inspect" -}}7795{{- end -}}
{{- define "bigfleet.port.inspectHttp" -}}8795{{- end -}}
{{- define "bigfleet.port.inspectMetrics" -}}8796{{- end -}}
{{- define "bigfleet.port.provider" -}}7800{{- end -}}
{{- define "bigfleet.port.providerMetrics" -}}8800{{- end -}}

{{/*
The shard pod's emptyDir is mounted at socketMount, but gateway and decide use socketDir, a
directory below it: an emptyDir is root-owned and world-writable, and the binaries refuse such
a socket directory (ADR-0102). They create socketDir themselves (0750, owned by the pod's uid).
*/}}
{{- define "bigfleet.socketMount" -}}/run/bigfleet{{- end -}}
{{- define "bigfleet.socketDir" -}}/run/bigfleet/sockets{{- end -}}
{{- define "bigfleet.crlDir" -}}/etc/bigfleet/crl{{- end -}}
{{- define "bigfleet.inspectHttpDir" -}}/etc/bigfleet/inspect-http{{- end -}}
{{- define "bigfleet.tlsDir" -}}/etc/bigfleet/tls{{- end -}}
{{- define "bigfleet.shardDataDir" -}}/var/lib/bigfleet-shard{{- end -}}
{{- define "bigfleet.coordinatorDataDir" -}}/var/lib/bigfleet{{- end -}}
{{- define "bigfleet.logDir" -}}/var/log/bigfleet{{- end -}}

{{- define "bigfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Short enough that "<fullname>-shard-headless" and "<fullname>-coordinator-NN" stay valid names. */}}
{{- define "bigfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "bigfleet.coordinatorName" -}}{{ include "bigfleet.fullname" . }}-coordinator{{- end -}}
{{- define "bigfleet.shardName" -}}{{ include "bigfleet.fullname" . }}-shard{{- end -}}
{{- define "bigfleet.shardHeadlessName" -}}{{ include "bigfleet.fullname" . }}-shard-headless{{- end -}}
{{- define "bigfleet.executeName" -}}{{ include "bigfleet.fullname" . }}-execute{{- end -}}
{{- define "bigfleet.inspectName" -}}{{ include "bigfleet.fullname" . }}-inspect{{- end -}}
{{- define "bigfleet.fakeProviderName" -}}{{ include "bigfleet.fullname" . }}-fake-provider{{- end -}}

{{- define "bigfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels; call with (dict "ctx" $ "component" "shard"). */}}
{{- define "bigfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bigfleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "bigfleet.labels" -}}
helm.sh/chart: {{ include "bigfleet.chart" .ctx }}
{{ include "bigfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: bigfleet
{{- end -}}

{{- define "bigfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bigfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Image of one binary; call with (dict "ctx" $ "binary" "bigfleet-coordinator"). */}}
{{- define "bigfleet.image" -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .ctx.Values.image.repository) .binary (default .ctx.Chart.AppVersion .ctx.Values.image.tag) -}}
{{- end -}}

{{/* Client URI scheme: https means mTLS with the process's --tls-* (docs/flags.md). */}}
{{- define "bigfleet.scheme" -}}{{ if .Values.tls.enabled }}https{{ else }}http{{ end }}{{- end -}}

{{- define "bigfleet.coordinatorHost" -}}
{{- printf "%s.%s.svc" (include "bigfleet.coordinatorName" .) .Release.Namespace -}}
{{- end -}}

{{- define "bigfleet.coordinatorAddr" -}}
{{- printf "%s://%s:%s" (include "bigfleet.scheme" .) (include "bigfleet.coordinatorHost" .) (include "bigfleet.port.coordinator" .) -}}
{{- end -}}

{{/* DNS name of shard pod <podName> through the headless Service. */}}
{{- define "bigfleet.shardPodHost" -}}
{{- printf "%s.%s.%s.svc" .pod (include "bigfleet.shardHeadlessName" .ctx) .ctx.Release.Namespace -}}
{{- end -}}

{{- define "bigfleet.fakeProviderEnabled" -}}
{{- if and .Values.shard.enabled (not .Values.provider.addr) -}}true{{- end -}}
{{- end -}}

{{/* The fake provider is always dialled in plaintext: it is a development stand-in. */}}
{{- define "bigfleet.providerAddr" -}}
{{- if .Values.provider.addr -}}
{{- .Values.provider.addr -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%s" (include "bigfleet.fakeProviderName" .) .Release.Namespace (include "bigfleet.port.provider" .) -}}
{{- end -}}
{{- end -}}

{{- define "bigfleet.etcdEndpoints" -}}{{ join "," .Values.etcd.endpoints }}{{- end -}}

{{- define "bigfleet.tlsSecret.coordinatorPrefix" -}}{{ default (printf "%s-coordinator-tls" (include "bigfleet.fullname" .)) .Values.tls.coordinator.secretName }}{{- end -}}
{{- define "bigfleet.tlsSecret.shardPrefix" -}}{{ default (printf "%s-shard-tls" (include "bigfleet.fullname" .)) .Values.tls.shard.secretName }}{{- end -}}
{{- define "bigfleet.tlsSecret.executePrefix" -}}{{ default (printf "%s-execute-tls" (include "bigfleet.fullname" .)) .Values.tls.execute.secretName }}{{- end -}}
{{- define "bigfleet.tlsSecret.inspect" -}}{{ default (printf "%s-inspect-tls" (include "bigfleet.fullname" .)) .Values.tls.inspect.secretName }}{{- end -}}
{{/*
The Secret holding inspect's HTTP bearer token (key `token`): inspect.http.tokenSecret, else the
chart-generated <fullname>-inspect-http, else (only with insecurePlaintext) none: empty string.
*/}}
{{- define "bigfleet.inspectHttpTokenSecret" -}}
{{- if .Values.inspect.http.tokenSecret -}}
{{- .Values.inspect.http.tokenSecret -}}
{{- else if include "bigfleet.inspectHttpTokenGenerated" . -}}
{{- include "bigfleet.inspectName" . }}-http
{{- end -}}
{{- end -}}

{{/* "true" when the chart generates inspect's HTTP token Secret. */}}
{{- define "bigfleet.inspectHttpTokenGenerated" -}}
{{- if and .Values.inspect.enabled (not .Values.inspect.http.tokenSecret) (not .Values.insecurePlaintext) -}}true{{- end -}}
{{- end -}}

{{/*
A number as a flag value: whole numbers as integers (Helm reads numbers in values as float64
and would print 1000000 as 1e+06), others as they are (0.5).
*/}}
{{- define "bigfleet.number" -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- end -}}

{{- define "bigfleet.caSecret" -}}{{ include "bigfleet.fullname" . }}-ca{{- end -}}
{{- define "bigfleet.pkiName" -}}{{ include "bigfleet.fullname" . }}-pki{{- end -}}

{{/* "true" when the chart's own CA hook (ADR-0110) provides the Secrets. */}}
{{- define "bigfleet.chartCA" -}}
{{- if and .Values.tls.enabled .Values.tls.chartCA.enabled (not .Values.tls.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{/* Every Secret the pki hook manages (the CA first), as a YAML list: the Role's resourceNames. */}}
{{- define "bigfleet.pki.secretNames" -}}
- {{ include "bigfleet.caSecret" . }}
{{- if .Values.coordinator.enabled }}
{{- range $i := until (int $.Values.coordinator.replicas) }}
- {{ printf "%s-%d" (include "bigfleet.tlsSecret.coordinatorPrefix" $) $i }}
{{- end }}
{{- end }}
{{- if .Values.shard.enabled }}
{{- range $i := until (int $.Values.shard.replicas) }}
- {{ printf "%s-%d" (include "bigfleet.tlsSecret.shardPrefix" $) $i }}
{{- if $.Values.execute.enabled }}
- {{ printf "%s-%d" (include "bigfleet.tlsSecret.executePrefix" $) $i }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.inspect.enabled }}
- {{ include "bigfleet.tlsSecret.inspect" . }}
{{- end }}
{{- end -}}

{{/*
The TLS volume of a StatefulSet whose pods each need their own Secret (ADR-0052): every
ordinal's Secret projected under <pod name>/, each optional so a missing one breaks only its
own pod. Call with (dict "name" <statefulset name> "secretPrefix" <prefix> "replicas" <n>).
*/}}
{{- define "bigfleet.perPodTlsVolume" -}}
- name: tls
  projected:
    sources:
      {{- range $i := until (int .replicas) }}
      {{- $pod := printf "%s-%d" $.name $i }}
      - secret:
          name: {{ printf "%s-%d" $.secretPrefix $i }}
          optional: true
          items:
            - {key: tls.crt, path: {{ $pod }}/tls.crt}
            - {key: tls.key, path: {{ $pod }}/tls.key}
            - {key: ca.crt, path: {{ $pod }}/ca.crt}
      {{- end }}
{{- end -}}

{{/*
Flags every service takes (docs/flags.md "Common to every service"), in --flag=value form only:
a bare or space-separated flag is never emitted (scripts/check-helm rejects both).
Call with (dict "ctx" $ "metrics" "8780" "tlsDir" "/etc/bigfleet/tls").
*/}}
{{- define "bigfleet.commonArgs" -}}
- --metrics-addr=:{{ .metrics }}
- --log-format={{ .ctx.Values.logFormat }}
- --drain-timeout={{ .ctx.Values.drainTimeout }}
{{- if .ctx.Values.tls.enabled }}
- --tls-cert={{ .tlsDir }}/tls.crt
- --tls-key={{ .tlsDir }}/tls.key
- --tls-ca={{ .tlsDir }}/ca.crt
{{- if .ctx.Values.tls.crl.secretName }}
- --tls-crl={{ include "bigfleet.crlDir" .ctx }}/ca.crl
{{- end }}
{{- end }}
{{- end -}}

{{/*
volumeMounts of every TLS container: the role's Secret and, with tls.crl.secretName, the CRL
Secret. Directory mounts, never subPath, so the kubelet's refreshes reach the processes
(leaves and CRLs are re-read when they change).
*/}}
{{- define "bigfleet.tlsMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "bigfleet.tlsDir" . }}
  readOnly: true
{{- if .Values.tls.crl.secretName }}
- name: tls-crl
  mountPath: {{ include "bigfleet.crlDir" . }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* The CRL volume (tls.crl.secretName, key ca.crl) of every pod with TLS containers. */}}
{{- define "bigfleet.crlVolume" -}}
{{- if and .Values.tls.enabled .Values.tls.crl.secretName }}
# Revocation lists (--tls-crl), re-read by every process when the kubelet refreshes them.
- name: tls-crl
  secret:
    secretName: {{ .Values.tls.crl.secretName }}
    items:
      - {key: ca.crl, path: ca.crl}
{{- end }}
{{- end -}}

{{/*
BIGFLEET_INSECURE_PLAINTEXT for every service container (not the fake provider, which is no
service of the mesh): only with insecurePlaintext, which the validation allows only without TLS.
*/}}
{{- define "bigfleet.plaintextEnv" -}}
{{- if .Values.insecurePlaintext }}
# insecurePlaintext: serve plaintext on non-loopback addresses (development only).
- name: BIGFLEET_INSECURE_PLAINTEXT
  value: "true"
{{- end }}
{{- end -}}

{{/* Environment of every container: downward-API identity and OpenTelemetry. */}}
{{- define "bigfleet.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if .Values.otlp.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otlp.endpoint | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
{{- end }}
{{- end -}}

{{/* HTTP liveness + readiness on a metrics port; call with (dict "port" "metrics"). */}}
{{- define "bigfleet.httpProbes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  initialDelaySeconds: 5
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
  periodSeconds: 5
  failureThreshold: 3
{{- end -}}

{{- define "bigfleet.containerSecurityContext" -}}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end -}}

{{- define "bigfleet.podCommon" -}}
serviceAccountName: {{ include "bigfleet.serviceAccountName" . }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/*
Scheduling of one role's pods (ADR-0121): nodeSelector, tolerations, affinity (the role's
`affinity`, plus pod anti-affinity on kubernetes.io/hostname per `podAntiAffinity` unless
`affinity.podAntiAffinity` is set), topologySpreadConstraints (`topologySpread`, each with the
role's labelSelector) and priorityClassName (the role's, else the chart's PriorityClass where
`usesChartPriority`). Call with (dict "ctx" $ "v" <role values> "selector" <matchLabels dict>
"usesChartPriority" true|false).
*/}}
{{- define "bigfleet.scheduling" -}}
{{- $v := .v }}
{{- $term := dict "labelSelector" (dict "matchLabels" .selector) "topologyKey" "kubernetes.io/hostname" }}
{{- $affinity := deepCopy ($v.affinity | default dict) }}
{{- $mode := $v.podAntiAffinity | default "none" }}
{{- if and (ne $mode "none") (not (hasKey $affinity "podAntiAffinity")) }}
{{- if eq $mode "required" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) }}
{{- else }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- end }}
{{- $priority := $v.priorityClassName | default "" }}
{{- if and (not $priority) .usesChartPriority .ctx.Values.priorityClass.create }}
{{- $priority = include "bigfleet.priorityClassName" .ctx }}
{{- end }}
{{- with $priority }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $spread := list }}
{{- range $v.topologySpread | default list }}
{{- $spread = append $spread (merge (dict "labelSelector" (dict "matchLabels" $.selector)) .) }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "bigfleet.priorityClassName" -}}{{ default (include "bigfleet.fullname" .) .Values.priorityClass.name }}{{- end -}}

{{- define "bigfleet.etcdTlsDir" -}}/etc/bigfleet/etcd{{- end -}}

{{/* --etcd-* TLS flags of decide and the execute workers (etcd.tls, etcd mode only). */}}
{{- define "bigfleet.etcdTlsArgs" -}}
{{- if and .Values.etcd.endpoints .Values.etcd.tls.secretName }}
- --etcd-ca={{ include "bigfleet.etcdTlsDir" . }}/ca.crt
{{- if .Values.etcd.tls.clientCert }}
- --etcd-cert={{ include "bigfleet.etcdTlsDir" . }}/tls.crt
- --etcd-key={{ include "bigfleet.etcdTlsDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "bigfleet.etcdTlsMount" -}}
{{- if and .Values.etcd.endpoints .Values.etcd.tls.secretName }}
- name: etcd-tls
  mountPath: {{ include "bigfleet.etcdTlsDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* etcd.tls.secretName with its keys renamed to the file names the flags point at. */}}
{{- define "bigfleet.etcdTlsVolume" -}}
{{- $t := .Values.etcd.tls }}
{{- if and .Values.etcd.endpoints $t.secretName }}
# TLS towards etcd (--etcd-ca/--etcd-cert/--etcd-key).
- name: etcd-tls
  secret:
    secretName: {{ $t.secretName }}
    items:
      - {key: {{ $t.caKey }}, path: ca.crt}
      {{- if $t.clientCert }}
      - {key: {{ $t.certKey }}, path: tls.crt}
      - {key: {{ $t.keyKey }}, path: tls.key}
      {{- end }}
{{- end }}
{{- end -}}

{{/* Cross-value rules the schema cannot express; rendering stops with a clear message. */}}
{{- define "bigfleet.validate" -}}
{{- if and .Values.inspect.enabled (not .Values.coordinator.enabled) -}}
{{- fail "inspect.enabled needs coordinator.enabled: inspect discovers shards through the coordinator" -}}
{{- end -}}
{{- if and .Values.execute.enabled (not .Values.shard.enabled) -}}
{{- fail "execute.enabled needs shard.enabled: remote execute workers serve this release's shards" -}}
{{- end -}}
{{- if and (not .Values.tls.enabled) (not .Values.insecurePlaintext) -}}
{{- fail "tls.enabled=false needs insecurePlaintext=true as well: without mTLS every port is unauthenticated (development only; docs/deploy.md)" -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.insecurePlaintext -}}
{{- fail "insecurePlaintext=true is only allowed with tls.enabled=false" -}}
{{- end -}}
{{- if and .Values.tls.crl.secretName (not .Values.tls.enabled) -}}
{{- fail "tls.crl.secretName needs tls.enabled: revocation lists are checked on TLS handshakes only" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.certManager.enabled needs tls.enabled" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.issuerRef.name is required when tls.certManager.enabled" -}}
{{- end -}}
{{- if and .Values.etcd.endpoints .Values.tls.enabled (not .Values.etcd.tls.secretName) -}}
{{- fail "etcd.endpoints with tls.enabled needs etcd.tls.secretName: decide and execute refuse plaintext etcd while the mesh runs with mTLS" -}}
{{- end -}}
{{- if and .Values.etcd.tls.secretName (not .Values.etcd.endpoints) -}}
{{- fail "etcd.tls.secretName needs etcd.endpoints" -}}
{{- end -}}
{{- if .Values.etcd.tls.secretName -}}
{{- range .Values.etcd.endpoints -}}
{{- if hasPrefix "http://" (lower .) -}}
{{- fail (printf "etcd endpoint %s is plaintext but etcd.tls.secretName is set: use https:// or host:port" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.tests.enabled .Values.tls.enabled (not .Values.inspect.enabled) (not .Values.tests.tlsSecret) -}}
{{- fail "tests.enabled with tls.enabled and inspect.enabled=false needs tests.tlsSecret (a client certificate from the mesh CA for the health probes), or tests.enabled=false" -}}
{{- end -}}
{{- with .Values.shard.auditLog -}}
{{- if not (or (hasPrefix (printf "%s/" (include "bigfleet.logDir" $)) .) (hasPrefix (printf "%s/" (include "bigfleet.shardDataDir" $)) .)) -}}
{{- fail (printf "shard.auditLog %q must be under %s/ or %s/ (the root filesystem is read-only)" . (include "bigfleet.logDir" $) (include "bigfleet.shardDataDir" $)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
