{{- define "jev.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "jev.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "frontend" "worker" "") */}}
{{- define "jev.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .worker }}
jev.dev/worker: {{ .worker }}
{{- end }}
{{- end -}}

{{- define "jev.image" -}}
{{- $image := index .root.Values.image .kind -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}

{{- define "jev.redisHost" -}}
{{- if .Values.redis.enabled -}}{{ include "jev.fullname" . }}-redis{{- else -}}{{ required "redis.external.host is required when redis.enabled is false" .Values.redis.external.host }}{{- end -}}
{{- end -}}

{{- define "jev.redisSecret" -}}
{{- if .Values.redis.enabled -}}{{ default (printf "%s-redis" (include "jev.fullname" .)) .Values.redis.existingSecret }}{{- else -}}{{ .Values.redis.external.existingSecret }}{{- end -}}
{{- end -}}

{{- define "jev.redisSecretKey" -}}
{{- if .Values.redis.enabled -}}{{ .Values.redis.secretKey }}{{- else -}}{{ .Values.redis.external.secretKey }}{{- end -}}
{{- end -}}

{{/* JEV_REDIS_PASSWORD from its Secret, then JEV_REDIS_URL built from it (Kubernetes expands $(VAR)) */}}
{{- define "jev.redisEnv" -}}
{{- $secret := include "jev.redisSecret" . -}}
{{- $scheme := ternary "rediss" "redis" (and (not .Values.redis.enabled) .Values.redis.external.tls) -}}
{{- $auth := ternary "default:$(JEV_REDIS_PASSWORD)@" "" (ne $secret "") -}}
{{- $port := ternary 6379 .Values.redis.external.port .Values.redis.enabled -}}
{{- $db := ternary 0 .Values.redis.external.db .Values.redis.enabled -}}
{{- if $secret }}
- name: JEV_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "jev.redisSecretKey" . }}
{{- end }}
- name: JEV_REDIS_URL
  value: {{ printf "%s://%s%s:%v/%v" $scheme $auth (include "jev.redisHost" .) $port $db | quote }}
{{- end -}}

{{/* JEV_INTERNAL_TOKENS for the frontend and every backend (workers, the preencoder): the chart's generated Secret,
or the operator's */}}
{{- define "jev.internalTokenEnv" -}}
- name: JEV_INTERNAL_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ default (printf "%s-internal-token" (include "jev.fullname" .)) .Values.internalToken.existingSecret }}
      key: {{ .Values.internalToken.key }}
{{- end -}}

{{/* The callers' API keys: the frontend's alone (it does not forward them; backends take the internal token) */}}
{{- define "jev.apiKeysEnv" -}}
{{- if .Values.apiKeys.existingSecret }}
- name: JEV_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.apiKeys.existingSecret }}
      key: {{ .Values.apiKeys.key }}
{{- end }}
{{- end -}}

{{- define "jev.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "jev.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "jev.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
