{{- define "kdsync-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kdsync-operator.labels" -}}
app.kubernetes.io/name: kdsync-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kdsync-operator.selector" -}}
app.kubernetes.io/name: kdsync-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kdsync-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kdsync-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kdsync-operator.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "kdsync-operator.fullname" .)) .Values.webhook.existingSecret -}}
{{- end -}}

{{- define "kdsync-operator.auditDriverRole" -}}
{{- printf "%s-audit-driver" (include "kdsync-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
