{{/* Labels on every object. */}}
{{- define "embark.labels" -}}
app.kubernetes.io/name: onboarding-endpoint
app.kubernetes.io/part-of: embark
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.istiodRevision }}
istio.io/rev: {{ . }}
{{- end }}
{{- end -}}

{{/* Selector labels: the kustomize base's, so both select the same Pods. */}}
{{- define "embark.selector" -}}
app.kubernetes.io/name: onboarding-endpoint
{{- end -}}

{{- define "embark.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The endpoint's configuration file (onboarding/config). */}}
{{- define "embark.config" -}}
apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
namespace: {{ .Release.Namespace }}
endpoint:
  hosts:
  {{- toYaml .Values.hosts | nindent 2 }}
  secretName: {{ .Values.tls.secretName }}
tokenIssuer:
  jwt:
    expiration: {{ .Values.tokenIssuer.expiration }}
mesh:
  clusterID: {{ .Values.mesh.clusterID }}
  trustDomain: {{ .Values.mesh.trustDomain }}
  discoveryAddress: {{ .Values.mesh.discoveryAddress | default (printf "%s:15012" (first .Values.hosts)) }}
  {{- with .Values.mesh.rootCertFile }}
  rootCertFile: {{ . }}
  {{- end }}
{{- with .Values.identity }}
identity:
  {{- toYaml . | nindent 2 }}
{{- end }}
registration:
  gracePeriod: {{ .Values.registration.gracePeriod }}
listen:
  onboarding: ":15443"
  xds: ":15012"
  metrics: ":15014"
{{- end -}}
