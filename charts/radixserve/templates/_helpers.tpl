{{/* Names and labels shared by every template of the chart. */}}

{{- define "radixserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "radixserve.operatorName" -}}
{{- printf "%s-operator" (include "radixserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "radixserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "radixserve.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "radixserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: radixserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: radixserve
{{- end -}}

{{- define "radixserve.operatorSelectorLabels" -}}
app.kubernetes.io/name: radixserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "radixserve.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "radixserve.defaultWorkerImage" -}}
{{- default (printf "ghcr.io/radixserve/radixserve:%s" .Chart.AppVersion) .Values.operator.defaultWorkerImage -}}
{{- end -}}

{{- define "radixserve.peeringName" -}}
{{- include "radixserve.operatorName" . -}}
{{- end -}}
