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

{{/* Selector labels: the kustomize base's (which is the release
"embark"), so both select the same Pods; the release name keeps two
releases (two istiod revisions) from selecting each other's Pods. */}}
{{- define "embark.selector" -}}
app.kubernetes.io/name: onboarding-endpoint
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* "-<revision>" for an istiodRevision other than the default, else
"": the suffix of every object name, so that the releases of two
revisions install side by side, as Istio's charts name istiod-<revision>.
*/}}
{{- define "embark.suffix" -}}
{{- if and .Values.istiodRevision (ne .Values.istiodRevision "default") -}}
-{{ .Values.istiodRevision }}
{{- end -}}
{{- end -}}

{{/* The name of the Deployment, its ServiceAccount, ConfigMap, PDB, HPA,
NetworkPolicy and Certificate. */}}
{{- define "embark.name" -}}
onboarding-endpoint{{ include "embark.suffix" . }}
{{- end -}}

{{/* The onboarding-token signing-key Secret (tokenIssuer.jwt.signingKeySecret). */}}
{{- define "embark.signingKeySecret" -}}
onboarding-token-signing-key{{ include "embark.suffix" . }}
{{- end -}}

{{/* The annotations that make the cloud providers' load balancer
controllers provision an internal load balancer: AWS (the in-tree
controller; the AWS Load Balancer Controller), GCP (GKE), Azure (AKS).
Each controller reads only its own; service.annotations win over them. */}}
{{- define "embark.internalLoadBalancerAnnotations" -}}
service.beta.kubernetes.io/aws-load-balancer-internal: "true"
service.beta.kubernetes.io/aws-load-balancer-scheme: internal
networking.gke.io/load-balancer-type: Internal
service.beta.kubernetes.io/azure-load-balancer-internal: "true"
{{- end -}}

{{- define "embark.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* istiod's secure gRPC address: istiod.address, or the Service of the
istiod of istiodRevision (istiod-<revision>; istiod for none or "default"). */}}
{{- define "embark.istiodAddress" -}}
{{- if .Values.istiod.address -}}
{{ .Values.istiod.address }}
{{- else if and .Values.istiodRevision (ne .Values.istiodRevision "default") -}}
istiod-{{ .Values.istiodRevision }}.{{ .Values.istiod.namespace }}.svc:15012
{{- else -}}
istiod.{{ .Values.istiod.namespace }}.svc:15012
{{- end -}}
{{- end -}}

{{/* The file of the roots sent to VMs (mesh.rootCertFile): the value, or
the key mesh.rootCerts mounts; empty when neither. */}}
{{- define "embark.meshRootCertFile" -}}
{{- if .Values.mesh.rootCertFile -}}
{{ .Values.mesh.rootCertFile }}
{{- else if .Values.mesh.rootCerts.enabled -}}
/etc/onboarding-endpoint-roots/{{ .Values.mesh.rootCerts.key }}
{{- end -}}
{{- end -}}

{{/* The volume of mesh.rootCerts: one key of a ConfigMap or of a Secret
(default: the serving Secret's ca.crt). */}}
{{- define "embark.meshRootsVolume" -}}
{{- with .Values.mesh.rootCerts -}}
{{- if and .secretName .configMapName -}}
{{- fail "mesh.rootCerts: set secretName or configMapName, not both (the endpoint reads one file: put every root into one key)" -}}
{{- end -}}
- name: mesh-roots
  {{- if .configMapName }}
  configMap:
    name: {{ .configMapName }}
  {{- else }}
  secret:
    secretName: {{ .secretName | default $.Values.tls.secretName }}
  {{- end }}
    items:
    - key: {{ .key }}
      path: {{ .key }}
{{- end -}}
{{- end -}}

{{/* The endpoint's configuration file (cmd/onboarding-endpoint/config). */}}
{{- define "embark.config" -}}
apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
namespace: {{ .Release.Namespace }}
workloadNamespaces:
{{- toYaml .Values.workloadNamespaces | nindent 0 }}
endpoint:
  hosts:
  {{- toYaml .Values.hosts | nindent 2 }}
  secretName: {{ .Values.tls.secretName }}
  {{- with .Values.detailedDenialSources }}
  detailedDenialSources:
  {{- toYaml . | nindent 2 }}
  {{- end }}
tokenIssuer:
  jwt:
    expiration: {{ .Values.tokenIssuer.expiration }}
    {{- with include "embark.suffix" . }}
    signingKeySecret: {{ include "embark.signingKeySecret" $ }}
    {{- end }}
mesh:
  clusterID: {{ .Values.mesh.clusterID }}
  trustDomain: {{ .Values.mesh.trustDomain }}
  discoveryAddress: {{ .Values.mesh.discoveryAddress | default (printf "%s:15012" (first .Values.hosts)) }}
  {{- with include "embark.meshRootCertFile" . }}
  rootCertFile: {{ . }}
  {{- end }}
  {{- with .Values.vmgateway.network }}
  network:
    pods: {{ . }}
    {{- with $.Values.vmgateway.podCIDRs }}
    podCIDRs:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $.Values.vmgateway.gatewayNetworks }}
    gateways:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  {{- end }}
{{- with .Values.identity }}
identity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.istiod }}
{{- if .enabled }}
istiod:
  address: {{ include "embark.istiodAddress" $ }}
  serverName: {{ include "embark.istiodAddress" $ | splitList ":" | first }}
  rootCertFile: /etc/istio-root/root-cert.pem
  {{- if not .relayXDS }}
  relayXDS: false
  {{- end }}
  {{- if and $.Values.istiodRevision (ne $.Values.istiodRevision "default") }}
  revision: {{ $.Values.istiodRevision }}
  {{- end }}
  {{- with .maxCertificateValidity }}
  maxCertificateValidity: {{ . }}
  {{- end }}
  {{- with .certificateRelay }}
  {{- if or .requestsPerSecond .burst .maxInFlight }}
  certificateRelay:
    {{- with .requestsPerSecond }}
    requestsPerSecond: {{ . }}
    {{- end }}
    {{- with .burst }}
    burst: {{ . }}
    {{- end }}
    {{- with .maxInFlight }}
    maxInFlight: {{ . }}
    {{- end }}
  {{- end }}
  {{- end }}
  {{- with .revisions }}
  revisions:
  {{- range . }}
  {{- $addr := .address | default (printf "istiod-%s.%s.svc:15012" .name $.Values.istiod.namespace) }}
  - name: {{ .name }}
    address: {{ $addr }}
    serverName: {{ .serverName | default ($addr | splitList ":" | first) }}
  {{- end }}
  {{- end }}
{{- end }}
{{- end }}
registration:
  gracePeriod: {{ .Values.registration.gracePeriod }}
  {{- with .Values.registration.outOfTrafficAfter }}
  outOfTrafficAfter: {{ . }}
  {{- end }}
{{- with .Values.limits.xds }}
{{- if or .maxSubscribedNamesPerType .maxSubscribedNameBytesPerStream }}
limits:
  xds:
    {{- with .maxSubscribedNamesPerType }}
    maxSubscribedNamesPerType: {{ int64 . }}
    {{- end }}
    {{- with .maxSubscribedNameBytesPerStream }}
    maxSubscribedNameBytesPerStream: {{ int64 . }}
    {{- end }}
{{- end }}
{{- end }}
{{- with .Values.localRepository }}
{{- if .enabled }}
localRepository:
  directory: {{ .directory }}
  {{- if .signingKey.secretName }}
  signingKeyFile: {{ include "embark.repositoryKeyDir" $ }}/{{ .signingKey.key }}
  {{- end }}
  metadataValidity: {{ .metadataValidity }}
  {{- with .extraSources }}
  extraDirectories:
  {{- range . }}
  - {{ include "embark.repositorySourcesDir" $ }}/{{ .name }}
  {{- end }}
  {{- end }}
{{- end }}
{{- end }}
listen:
  onboarding: ":15443"
  xds: ":15012"
  metrics: ":15014"
  {{- if .Values.localRepository.enabled }}
  repository: ":8443"
  {{- end }}
{{- end -}}

{{/* Where localRepository.extraSources are mounted, one directory each. */}}
{{- define "embark.repositorySourcesDir" -}}
/var/lib/onboarding-endpoint/repository-sources
{{- end -}}

{{/* Where the repository's signing key Secret is mounted. */}}
{{- define "embark.repositoryKeyDir" -}}
/etc/onboarding-endpoint-repository-key
{{- end -}}
