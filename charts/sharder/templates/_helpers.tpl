{{/* The release's full name, cut to 63 characters. */}}
{{- define "sharder.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sharder.webhook" -}}{{ include "sharder.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}
{{- define "sharder.reconciler" -}}{{ include "sharder.fullname" . | trunc 52 | trimSuffix "-" }}-reconciler{{- end -}}

{{/* The Secret holding the webhook's tls.crt, tls.key and ca.crt. */}}
{{- define "sharder.tlsSecret" -}}
{{- if and (eq .Values.tls.mode "secret") .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else -}}
{{- include "sharder.webhook" . }}-tls
{{- end -}}
{{- end -}}

{{- define "sharder.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sharder
{{- end -}}

{{/* Selector labels of one component: include with (list . "webhook"). */}}
{{- define "sharder.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "sharder.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Every (group, resource) the reconciler lists and patches, as "group/resource" strings. */}}
{{- define "sharder.shardedResources" -}}
{{- $all := list -}}
{{- range concat .Values.clusterRings .Values.controllerRings -}}
{{- range .resources -}}
{{- $all = append $all (printf "%s/%s" (.group | default "") .resource) -}}
{{- range .controlledResources -}}
{{- $all = append $all (printf "%s/%s" (.group | default "") .resource) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.shardedResources -}}
{{- $group := .group | default "" -}}
{{- range .resources -}}
{{- $all = append $all (printf "%s/%s" $group .) -}}
{{- end -}}
{{- end -}}
{{- $all | uniq | sortAlpha | join "," -}}
{{- end -}}

{{/*
RBAC rules over the sharded resources, one per API group, with the given verbs:
include "sharder.shardedResourceRules" (dict "root" . "verbs" (list "get"))
*/}}
{{- define "sharder.shardedResourceRules" -}}
{{- $byGroup := dict }}
{{- range (include "sharder.shardedResources" .root | splitList ",") }}
{{- if . }}
{{- $parts := splitList "/" . }}
{{- $group := index $parts 0 }}
{{- $_ := set $byGroup $group (append (get $byGroup $group | default list) (index $parts 1)) }}
{{- end }}
{{- end }}
{{- range $group, $resources := $byGroup }}
- apiGroups: [{{ $group | quote }}]
  resources: {{ $resources | toJson }}
  verbs: {{ $.verbs | toJson }}
{{- end }}
{{- end -}}
