{{/* Names and labels. */}}
{{- define "sendonce.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sendonce.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sendonce.labels" -}}
{{ include "sendonce.selector" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: sendonce
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sendonce.image" -}}
{{- $i := .Values.image -}}
{{- if $i.digest -}}
{{ $i.repository }}@{{ $i.digest }}
{{- else -}}
{{ $i.repository }}:{{ $i.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Each component's health and metrics port: the binaries' HTTP_ADDR
defaults, served on every interface. */}}
{{- define "sendonce.httpPort" -}}
{{- get (dict "relay" 9101 "sender" 9102 "receiver" 9103) . -}}
{{- end -}}

{{/* The pod's security context: the image's non-root user (distroless
nonroot, uid 65532), no service account token. */}}
{{- define "sendonce.podSecurity" -}}
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "sendonce.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{- define "sendonce.placement" -}}
{{- with .root.Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- if .root.Values.topologySpread }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "sendonce.selector" . | nindent 8 }}
{{- end }}
{{- end -}}

{{/* Settings every component shares: logs, the database URL's file and
its checks. .who is the component, whose key of database.keys names its
URL. */}}
{{- define "sendonce.databaseEnv" -}}
- name: DATABASE_URL_FILE
  value: /etc/sendonce/database/url
- name: DATABASE_POOLER
  value: {{ .root.Values.database.pooler | quote }}
{{- if .root.Values.database.allowInsecure }}
- name: DATABASE_ALLOW_INSECURE
  value: "true"
{{- end }}
{{- end -}}

{{- define "sendonce.logEnv" -}}
- name: LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- end -}}

{{/* NATS settings for the user .user (a key of nats.users). */}}
{{- define "sendonce.natsEnv" -}}
{{- $n := .root.Values.nats -}}
{{- $u := get $n.users .user -}}
- name: NATS_URL
  value: {{ $n.url | quote }}
- name: NATS_USER
  value: {{ $u.user | quote }}
- name: NATS_PASSWORD_FILE
  value: /etc/sendonce/nats/password
- name: NATS_INBOX_PREFIX
  value: {{ printf "_INBOX_%s" $u.user | quote }}
{{- if $n.caSecret }}
- name: NATS_CA
  value: /etc/sendonce/nats-ca/ca.crt
{{- end }}
{{- if $n.allowInsecure }}
- name: NATS_ALLOW_INSECURE
  value: "true"
{{- end }}
{{- end -}}

{{/* Settings given by variable name in values (env, settings): plain
values only, quoted. */}}
{{- define "sendonce.extraEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{/* Credentials read from files: a map of variable name to key of one
Secret, mounted at .dir; each becomes NAME_FILE. */}}
{{- define "sendonce.fileEnv" -}}
{{- $dir := .dir -}}
{{- range $k, $key := .files }}
- name: {{ printf "%s_FILE" $k }}
  value: {{ printf "%s/%s" $dir $key | quote }}
{{- end }}
{{- end -}}

{{/* Volumes: the database URL (one key of the database Secret), the
CAs, and /tmp. */}}
{{- define "sendonce.databaseVolumes" -}}
- name: database
  secret:
    secretName: {{ .root.Values.database.existingSecret }}
    defaultMode: 0400
    items:
      - key: {{ get .root.Values.database.keys .who }}
        path: url
{{- with .root.Values.database.caSecret }}
- name: postgres-ca
  secret:
    secretName: {{ . }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- end -}}

{{- define "sendonce.databaseMounts" -}}
- name: database
  mountPath: /etc/sendonce/database
  readOnly: true
{{- if .root.Values.database.caSecret }}
- name: postgres-ca
  mountPath: /etc/sendonce/postgres-ca
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "sendonce.natsVolumes" -}}
{{- $n := .root.Values.nats -}}
- name: nats
  secret:
    secretName: {{ $n.existingSecret }}
    defaultMode: 0400
    items:
      - key: {{ (get $n.users .user).key }}
        path: password
{{- with $n.caSecret }}
- name: nats-ca
  secret:
    secretName: {{ . }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}

{{- define "sendonce.natsMounts" -}}
- name: nats
  mountPath: /etc/sendonce/nats
  readOnly: true
{{- if .root.Values.nats.caSecret }}
- name: nats-ca
  mountPath: /etc/sendonce/nats-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* Probes on a component's health port. */}}
{{- define "sendonce.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* The senders' lag threshold and maximum (see values.yaml,
autoscaling). */}}
{{- define "sendonce.lagThreshold" -}}
{{- mul .Values.autoscaling.senderRate .Values.autoscaling.drainSeconds -}}
{{- end -}}

{{- define "sendonce.maxSenders" -}}
{{- $a := .Values.autoscaling -}}
{{- $max := int $a.maxReplicas -}}
{{- $limit := int .Values.providers.rateLimit -}}
{{- if gt $limit 0 -}}
{{- $useful := add (div (add $limit (sub $a.senderRate 1)) $a.senderRate) 1 | int -}}
{{- $max = min $max $useful | int -}}
{{- end -}}
{{- max $max (int $a.minReplicas) -}}
{{- end -}}

{{/* keda or hpa, from autoscaling.mode and the cluster's API versions. */}}
{{- define "sendonce.scaler" -}}
{{- $mode := .Values.autoscaling.mode -}}
{{- if eq $mode "auto" -}}
{{- if .Capabilities.APIVersions.Has "keda.sh/v1alpha1" }}keda{{ else }}hpa{{ end -}}
{{- else if has $mode (list "keda" "hpa") -}}
{{- $mode -}}
{{- else -}}
{{- fail (printf "autoscaling.mode must be auto, keda or hpa, not %q" $mode) -}}
{{- end -}}
{{- end -}}

{{/* OpenTelemetry (docs/observability.md): on with an endpoint. */}}
{{- define "sendonce.tracingEnv" -}}
{{- with .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- range $k, $v := $.Values.tracing.env }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}
