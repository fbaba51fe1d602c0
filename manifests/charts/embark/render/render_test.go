package main

import (
	"os"
	"strings"
	"testing"
)

const chartDir = ".."

// Bad values are refused by values.schema.json before anything renders,
// with a message naming the value.
func TestSchemaRefusesBadValues(t *testing.T) {
	tests := []struct {
		name    string
		vals    map[string]any
		wantErr string
	}{
		{name: "no replicas", vals: map[string]any{"replicas": 0}, wantErr: "replicas"},
		{name: "replicas not a number", vals: map[string]any{"replicas": "two"}, wantErr: "replicas"},
		{name: "no hosts", vals: map[string]any{"hosts": []any{}}, wantErr: "hosts"},
		{name: "host with a port", vals: map[string]any{"hosts": []any{"a.example.corp:443"}}, wantErr: "hosts"},
		{name: "unknown service type", vals: map[string]any{"service": map[string]any{"type": "Ingress"}}, wantErr: "service"},
		{name: "misspelt top-level key", vals: map[string]any{"replica": 3}, wantErr: "replica"},
		{name: "bad digest", vals: map[string]any{"image": map[string]any{"repository": "x", "digest": "sha256:abc"}}, wantErr: "digest"},
		{name: "cert-manager without an issuer", vals: map[string]any{"tls": map[string]any{"secretName": "s", "certManager": map[string]any{"enabled": true}}}, wantErr: "issuerRef"},
		{name: "bad memory quantity", vals: map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "lots"}}}, wantErr: "memory"},
		{name: "bad revision", vals: map[string]any{"istiodRevision": "Canary_1"}, wantErr: "istiodRevision"},
		{name: "istiod address without a port", vals: map[string]any{"istiod": map[string]any{"address": "istiod.istio-system.svc"}}, wantErr: "address"},
		{name: "istiod revision named default", vals: map[string]any{"istiod": map[string]any{"revisions": []any{map[string]any{"name": "default"}}}}, wantErr: "revisions"},
		{name: "istiod revision without a name", vals: map[string]any{"istiod": map[string]any{"revisions": []any{map[string]any{"address": "istiod-canary.istio-system.svc:15012"}}}}, wantErr: "revisions"},
		{name: "istiod revision not a DNS label", vals: map[string]any{"istiod": map[string]any{"revisions": []any{map[string]any{"name": "Canary"}}}}, wantErr: "revisions"},
		{name: "no workload namespaces", vals: map[string]any{"workloadNamespaces": []any{}}, wantErr: "workloadNamespaces"},
		{name: "workload namespace not a DNS label", vals: map[string]any{"workloadNamespaces": []any{"Book_Info"}}, wantErr: "workloadNamespaces"},
		{name: "misspelt istiod key", vals: map[string]any{"istiod": map[string]any{"relayXds": true}}, wantErr: "relayXds"},
		{name: "source range not a CIDR", vals: map[string]any{"service": map[string]any{"loadBalancerSourceRanges": []any{"everyone"}}}, wantErr: "loadBalancerSourceRanges"},
		{name: "internal not a boolean", vals: map[string]any{"service": map[string]any{"internal": "no"}}, wantErr: "internal"},
		{name: "unknown traffic policy", vals: map[string]any{"service": map[string]any{"externalTrafficPolicy": "Nearest"}}, wantErr: "externalTrafficPolicy"},
		{name: "VM source not a CIDR", vals: map[string]any{"networkPolicy": map[string]any{"vmSources": []any{"10.0.0.1"}}}, wantErr: "vmSources"},
		{name: "misspelt networkPolicy key", vals: map[string]any{"networkPolicy": map[string]any{"enable": false}}, wantErr: "enable"},
		{name: "roots key a path", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"key": "../ca.crt"}}}, wantErr: "key"},
		{name: "roots file relative", vals: map[string]any{"mesh": map[string]any{"rootCertFile": "roots/ca.crt"}}, wantErr: "rootCertFile"},
		{name: "misspelt rootCerts key", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"secret": "x"}}}, wantErr: "secret"},
		{name: "global not an object", vals: map[string]any{"global": "hub"}, wantErr: "global"},
		{name: "serviceAccount annotation not a string", vals: map[string]any{"serviceAccount": map[string]any{"annotations": map[string]any{"a": 1}}}, wantErr: "annotations"},
		{name: "priority class not a name", vals: map[string]any{"priorityClassName": "High Priority"}, wantErr: "priorityClassName"},
		{name: "spread constraint without topologyKey", vals: map[string]any{"topologySpreadConstraints": []any{map[string]any{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}}}, wantErr: "topologyKey"},
		{name: "env without a name", vals: map[string]any{"extraEnv": []any{map[string]any{"value": "x"}}}, wantErr: "name"},
		{name: "volume name not a DNS label", vals: map[string]any{"extraVolumes": []any{map[string]any{"name": "My_Vol", "emptyDir": map[string]any{}}}}, wantErr: "extraVolumes"},
		{name: "mount without a path", vals: map[string]any{"extraVolumeMounts": []any{map[string]any{"name": "v"}}}, wantErr: "mountPath"},
		{name: "misspelt autoscaling key", vals: map[string]any{"autoscaling": map[string]any{"enable": true}}, wantErr: "enable"},
		{name: "autoscaling to zero", vals: map[string]any{"autoscaling": map[string]any{"minReplicas": 0}}, wantErr: "minReplicas"},
		{name: "misspelt localRepository key", vals: map[string]any{"localRepository": map[string]any{"enable": true}}, wantErr: "enable"},
		{name: "repository directory relative", vals: map[string]any{"localRepository": map[string]any{"directory": "packages"}}, wantErr: "directory"},
		{name: "signing key Secret not a name", vals: map[string]any{"localRepository": map[string]any{"signingKey": map[string]any{"secretName": "Repo Key"}}}, wantErr: "secretName"},
		{name: "signing key a path", vals: map[string]any{"localRepository": map[string]any{"signingKey": map[string]any{"key": "../signing.asc"}}}, wantErr: "key"},
		{name: "metadata validity not a duration", vals: map[string]any{"localRepository": map[string]any{"metadataValidity": "7d"}}, wantErr: "metadataValidity"},
		{name: "extra source without a volume", vals: map[string]any{"localRepository": map[string]any{"extraSources": []any{map[string]any{"name": "istio-sidecar"}}}}, wantErr: "volume"},
		{name: "extra source name not a DNS label", vals: map[string]any{"localRepository": map[string]any{"extraSources": []any{map[string]any{"name": "Istio_Sidecar", "volume": map[string]any{"emptyDir": map[string]any{}}}}}}, wantErr: "name"},
		{name: "extra source volume naming itself", vals: map[string]any{"localRepository": map[string]any{"extraSources": []any{map[string]any{"name": "a", "volume": map[string]any{"name": "b", "emptyDir": map[string]any{}}}}}}, wantErr: "volume"},
		{name: "extra source volume empty", vals: map[string]any{"localRepository": map[string]any{"extraSources": []any{map[string]any{"name": "a", "volume": map[string]any{}}}}}, wantErr: "volume"},
		{name: "out-of-traffic delay not a duration", vals: map[string]any{"registration": map[string]any{"outOfTrafficAfter": "ten seconds"}}, wantErr: "outOfTrafficAfter"},
		{name: "detailed denial source not a CIDR", vals: map[string]any{"detailedDenialSources": []any{"10.0.0.1"}}, wantErr: "detailedDenialSources"},
		{name: "misspelt xds limit", vals: map[string]any{"limits": map[string]any{"xds": map[string]any{"maxSubscribedNames": 10}}}, wantErr: "maxSubscribedNames"},
		{name: "subscribed name bytes over 2 MiB", vals: map[string]any{"limits": map[string]any{"xds": map[string]any{"maxSubscribedNameBytesPerStream": 3 << 20}}}, wantErr: "maxSubscribedNameBytesPerStream"},
		{name: "negative subscribed names", vals: map[string]any{"limits": map[string]any{"xds": map[string]any{"maxSubscribedNamesPerType": -1}}}, wantErr: "maxSubscribedNamesPerType"},
		{name: "certificate relay in flight over 4096", vals: map[string]any{"istiod": map[string]any{"certificateRelay": map[string]any{"maxInFlight": 5000}}}, wantErr: "maxInFlight"},
		{name: "certificate validity in days", vals: map[string]any{"istiod": map[string]any{"maxCertificateValidity": "1d"}}, wantErr: "maxCertificateValidity"},
		{name: "PDB minAvailable a boolean", vals: map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": true}}, wantErr: "minAvailable"},
		{name: "misspelt PDB key", vals: map[string]any{"podDisruptionBudget": map[string]any{"maxUnavailable": 1}}, wantErr: "maxUnavailable"},
		{name: "pod annotation not a string", vals: map[string]any{"podAnnotations": map[string]any{"a": 1}}, wantErr: "podAnnotations"},
		{name: "image pull secret without a name", vals: map[string]any{"imagePullSecrets": []any{map[string]any{}}}, wantErr: "name"},
		{name: "unknown pull policy", vals: map[string]any{"image": map[string]any{"repository": "x", "pullPolicy": "Sometimes"}}, wantErr: "pullPolicy"},
		{name: "metrics selector misspelt", vals: map[string]any{"networkPolicy": map[string]any{"metrics": map[string]any{"namespaceSelector": map[string]any{"matchLabel": map[string]any{"a": "b"}}}}}, wantErr: "matchLabel"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(chartDir, "embark", "istio-system", tc.vals)
			if err == nil {
				t.Fatalf("values %v rendered; want a schema error", tc.vals)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not name %q", err, tc.wantErr)
			}
		})
	}
}

// The defaults, and every toggle on, render and pass Helm's lint rules.
func TestRenders(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		wants []string
		nots  []string
	}{
		{name: "defaults", wants: []string{"kind: Deployment", "kind: ClusterRole", "image: embark-mesh/onboarding-endpoint:" + version(t), "type: LoadBalancer"},
			nots: []string{"kind: Certificate", "kind: ServiceMonitor", "istio.io/rev",
				// istiod mode reads no mesh configuration cluster-wide.
				"kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-mesh-config"}},
		{name: "workload namespaces", vals: map[string]any{"workloadNamespaces": []any{"bookinfo", "payments"}},
			wants: []string{"workloadNamespaces:\n    - bookinfo\n    - payments\n",
				"name: embark-onboarding-endpoint-workloads\n  namespace: bookinfo\n", "name: embark-onboarding-endpoint-workloads\n  namespace: payments\n"}},
		{name: "everything on", vals: map[string]any{
			"replicas":       3,
			"istiodRevision": "1-30",
			"image":          map[string]any{"repository": "registry.example.corp/embark", "digest": "sha256:" + strings.Repeat("a", 64)},
			"tls":            map[string]any{"secretName": "embark-tls", "certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"}}},
			"service":        map[string]any{"type": "LoadBalancer", "annotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}},
			"monitoring": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true},
				"dashboard": map[string]any{"enabled": true}},
		}, wants: []string{"replicas: 3", "istio.io/rev: 1-30", "image: registry.example.corp/embark@sha256:", "kind: Certificate", "secretName: embark-tls",
			// The Role names the serving Secret, and only it and the signing key.
			"resourceNames: [embark-tls]",
			"aws-load-balancer-scheme: internal", "kind: ServiceMonitor", "kind: PrometheusRule", "runbook_url:", "embark-dashboard.json",
			// The revision's istiod, not the default one.
			"address: istiod-1-30.istio-system.svc:15012", "serverName: istiod-1-30.istio-system.svc"}},
		{name: "revision names", vals: map[string]any{"istiodRevision": "canary", "autoscaling": map[string]any{"enabled": true},
			"tls":        map[string]any{"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "corp-ca"}}},
			"monitoring": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}, "dashboard": map[string]any{"enabled": true}}},
			wants: []string{"kind: Deployment\nmetadata:\n  name: onboarding-endpoint-canary\n", "kind: Service\nmetadata:\n  name: vmgateway-canary\n",
				"name: onboarding-endpoint-metrics-canary\n", "kind: PodDisruptionBudget\nmetadata:\n  name: onboarding-endpoint-canary\n",
				"kind: ClusterRole\nmetadata:\n  name: embark-onboarding-endpoint-canary\n", "kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-canary\n",
				"kind: ClusterRole\nmetadata:\n  name: embark-onboarding-endpoint-workloads-canary\n", "name: embark-onboarding-endpoint-workloads-canary\n  namespace: bookinfo\n",
				"      serviceAccountName: onboarding-endpoint-canary\n", "- kind: ServiceAccount\n  name: onboarding-endpoint-canary\n",
				"signingKeySecret: onboarding-token-signing-key-canary\n", "resourceNames: [onboarding-token-signing-key-canary]",
				"kind: Secret\nmetadata:\n  name: onboarding-token-signing-key-canary\n",
				"    kind: Deployment\n    name: onboarding-endpoint-canary\n", "kind: Certificate\nmetadata:\n  name: onboarding-endpoint-canary\n",
				"kind: ServiceMonitor\nmetadata:\n  name: onboarding-endpoint-canary\n", "kind: PrometheusRule\nmetadata:\n  name: embark-canary\n", "name: embark-grafana-dashboard-canary\n",
				"  selector:\n    app.kubernetes.io/name: onboarding-endpoint\n    app.kubernetes.io/instance: embark\n"},
			nots: []string{"metadata:\n  name: onboarding-endpoint\n", "metadata:\n  name: vmgateway\n", "metadata:\n  name: embark-onboarding-endpoint\n", "metadata:\n  name: onboarding-token-signing-key\n", "  name: embark\n"}},
		{name: "the default revision keeps the plain names", vals: map[string]any{"istiodRevision": "default"},
			wants: []string{"kind: Deployment\nmetadata:\n  name: onboarding-endpoint\n", "kind: Service\nmetadata:\n  name: vmgateway\n"},
			nots:  []string{"signingKeySecret", "-default"}},
		{name: "standalone, no istiod", vals: map[string]any{"istiod": map[string]any{"enabled": false}},
			wants: []string{"kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-mesh-config"},
			nots:  []string{"istiod:", "istio-ca-root-cert", "/etc/istio-root"}},
		{name: "istiod at an explicit address, standalone translation", vals: map[string]any{"istiod": map[string]any{"address": "istiod.mesh.svc:15012", "relayXDS": false}},
			wants: []string{"address: istiod.mesh.svc:15012", "serverName: istiod.mesh.svc", "relayXDS: false", "name: istio-ca-root-cert", "kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-mesh-config"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(chartDir, "embark", "istio-system", tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("rendered chart lacks %q", w)
				}
			}
			for _, n := range tc.nots {
				if strings.Contains(out, n) {
					t.Errorf("rendered chart has %q", n)
				}
			}
		})
	}
}

// internalAnnotations are what makes AWS, GCP and Azure provision an
// internal load balancer.
var internalAnnotations = []string{
	"service.beta.kubernetes.io/aws-load-balancer-internal: \"true\"",
	"service.beta.kubernetes.io/aws-load-balancer-scheme: internal",
	"networking.gke.io/load-balancer-type: Internal",
	"service.beta.kubernetes.io/azure-load-balancer-internal: \"true\"",
}

// vmgateway is internal by default; an internet-facing one needs source
// ranges; the NetworkPolicy is on by default, admits the VM-facing ports
// (from vmSources when set) and metrics only from the monitoring pods.
func TestExposure(t *testing.T) {
	networkPolicy := "kind: NetworkPolicy\nmetadata:\n  name: onboarding-endpoint\n"
	metricsFromMonitoring := "  - ports:\n    - port: http-metrics\n      protocol: TCP\n    from:\n    - namespaceSelector:\n        matchLabels:\n          kubernetes.io/metadata.name: monitoring\n"
	tests := []struct {
		name    string
		vals    map[string]any
		wants   []string
		nots    []string
		wantErr string
	}{
		{name: "defaults: internal load balancer, NetworkPolicy",
			wants: append([]string{"type: LoadBalancer", "externalTrafficPolicy: Cluster", networkPolicy, "policyTypes: [Ingress]",
				"    - port: grpc-onboard\n      protocol: TCP\n    - port: grpc-xds\n      protocol: TCP\n    - port: https-repo\n      protocol: TCP\n  - ports:",
				metricsFromMonitoring}, internalAnnotations...),
			nots: []string{"loadBalancerSourceRanges:", "ipBlock"}},
		{name: "internet-facing without source ranges", vals: map[string]any{"service": map[string]any{"internal": false}},
			wantErr: "service.internal is false, which makes vmgateway an internet-facing load balancer, and service.loadBalancerSourceRanges is empty"},
		{name: "internet-facing with source ranges", vals: map[string]any{"service": map[string]any{"internal": false, "loadBalancerSourceRanges": []any{"203.0.113.0/24", "2001:db8::/32"}, "externalTrafficPolicy": "Local"}},
			wants: []string{"loadBalancerSourceRanges:\n    - 203.0.113.0/24\n    - 2001:db8::/32\n", "externalTrafficPolicy: Local"},
			nots:  internalAnnotations},
		{name: "internal with source ranges too", vals: map[string]any{"service": map[string]any{"loadBalancerSourceRanges": []any{"10.0.0.0/8"}}},
			wants: append([]string{"loadBalancerSourceRanges:\n    - 10.0.0.0/8\n"}, internalAnnotations...)},
		{name: "an annotation of the operator's wins", vals: map[string]any{"service": map[string]any{"annotations": map[string]any{"networking.gke.io/load-balancer-type": "External", "example.com/team": "mesh"}}},
			wants: []string{"networking.gke.io/load-balancer-type: External", "example.com/team: mesh", "service.beta.kubernetes.io/aws-load-balancer-internal: \"true\""}},
		{name: "ClusterIP: no load balancer settings", vals: map[string]any{"service": map[string]any{"type": "ClusterIP", "internal": false}},
			wants: []string{"type: ClusterIP"}, nots: append([]string{"externalTrafficPolicy", "loadBalancerSourceRanges:"}, internalAnnotations...)},
		{name: "NodePort", vals: map[string]any{"service": map[string]any{"type": "NodePort"}},
			wants: []string{"type: NodePort", "externalTrafficPolicy: Cluster"}, nots: internalAnnotations},
		{name: "VM sources and a Prometheus selector", vals: map[string]any{"networkPolicy": map[string]any{
			"vmSources": []any{"10.20.0.0/16", "192.168.1.0/24"},
			"metrics":   map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "observability"}}, "podSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "prometheus"}}},
		}},
			wants: []string{"    from:\n    - ipBlock:\n        cidr: 10.20.0.0/16\n    - ipBlock:\n        cidr: 192.168.1.0/24\n",
				"kubernetes.io/metadata.name: observability\n      podSelector:\n        matchLabels:\n          app.kubernetes.io/name: prometheus\n"},
			nots: []string{"kubernetes.io/metadata.name: monitoring"}},
		{name: "NetworkPolicy off", vals: map[string]any{"networkPolicy": map[string]any{"enabled": false}}, nots: []string{"kind: NetworkPolicy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(chartDir, "embark", "istio-system", tc.vals)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Render: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("rendered chart lacks %q", w)
				}
			}
			for _, n := range tc.nots {
				if strings.Contains(out, n) {
					t.Errorf("rendered chart has %q", n)
				}
			}
		})
	}
}

// The roots VMs verify the discovery address with are mounted and sent by
// default (the serving Secret's ca.crt); a ConfigMap or another Secret can
// hold them instead; switched off, none are mounted or sent.
func TestMeshRoots(t *testing.T) {
	rootsMount := "        - name: mesh-roots\n          mountPath: /etc/onboarding-endpoint-roots\n          readOnly: true\n"
	tests := []struct {
		name    string
		vals    map[string]any
		wants   []string
		nots    []string
		wantErr string
	}{
		{name: "defaults: the serving Secret's ca.crt",
			wants: []string{"rootCertFile: /etc/onboarding-endpoint-roots/ca.crt\n", rootsMount,
				"      - name: mesh-roots\n        secret:\n          secretName: onboarding-endpoint-tls\n          items:\n          - key: ca.crt\n            path: ca.crt\n"}},
		{name: "the serving Secret of tls.secretName", vals: map[string]any{"tls": map[string]any{"secretName": "embark-tls"}},
			wants: []string{"        secret:\n          secretName: embark-tls\n          items:\n          - key: ca.crt\n"}},
		{name: "a ConfigMap holding every root", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"configMapName": "vm-roots", "key": "roots.pem"}}},
			wants: []string{"rootCertFile: /etc/onboarding-endpoint-roots/roots.pem\n", rootsMount,
				"      - name: mesh-roots\n        configMap:\n          name: vm-roots\n          items:\n          - key: roots.pem\n            path: roots.pem\n"},
			nots: []string{"secretName: onboarding-endpoint-tls\n          items"}},
		{name: "another Secret", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"secretName": "corp-ca"}}},
			wants: []string{"        secret:\n          secretName: corp-ca\n          items:\n          - key: ca.crt\n"}},
		{name: "a file of the operator's volume", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"enabled": false}, "rootCertFile": "/etc/vm-roots/roots.pem"}},
			wants: []string{"rootCertFile: /etc/vm-roots/roots.pem\n"}, nots: []string{"mesh-roots", "/etc/onboarding-endpoint-roots"}},
		{name: "off: no roots sent", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"enabled": false}}},
			nots: []string{"mesh-roots", "/etc/onboarding-endpoint-roots", "\n  rootCertFile:"}},
		{name: "both a Secret and a ConfigMap", vals: map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"secretName": "a", "configMapName": "b"}}},
			wantErr: "mesh.rootCerts: set secretName or configMapName, not both"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkRender(t, tc.vals, tc.wants, tc.nots, tc.wantErr)
		})
	}
}

// The Pod options of Istio's charts render where Kubernetes reads them and
// render nothing when unset; global values are accepted (a subchart).
func TestPodOptions(t *testing.T) {
	tests := []struct {
		name    string
		vals    map[string]any
		wants   []string
		nots    []string
		wantErr string
	}{
		{name: "defaults render none of them",
			wants: []string{"replicas: 2\n", "podAntiAffinity:"},
			nots:  []string{"kind: HorizontalPodAutoscaler", "priorityClassName", "topologySpreadConstraints"}},
		{name: "global values of a parent chart", vals: map[string]any{"global": map[string]any{"hub": "registry.example.corp/istio", "tag": "1.30.0"}},
			wants: []string{"kind: Deployment"}},
		{name: "ServiceAccount annotations (IRSA)", vals: map[string]any{"serviceAccount": map[string]any{"annotations": map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/embark"}}},
			wants: []string{"kind: ServiceAccount\nmetadata:\n  name: onboarding-endpoint\n", "  annotations:\n    eks.amazonaws.com/role-arn: arn:aws:iam::111122223333:role/embark\nautomountServiceAccountToken: true"}},
		{name: "scheduling", vals: map[string]any{
			"priorityClassName": "system-cluster-critical",
			"topologySpreadConstraints": []any{map[string]any{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "onboarding-endpoint"}}}},
			"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{
				map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "In", "values": []any{"mesh"}}}}}}}},
			"tolerations":  []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "mesh", "effect": "NoSchedule"}},
			"nodeSelector": map[string]any{"kubernetes.io/arch": "arm64"},
		},
			wants: []string{"      priorityClassName: system-cluster-critical\n",
				"      topologySpreadConstraints:\n        - labelSelector:\n            matchLabels:\n              app.kubernetes.io/name: onboarding-endpoint\n          maxSkew: 1\n          topologyKey: topology.kubernetes.io/zone\n          whenUnsatisfiable: ScheduleAnyway\n",
				"      affinity:\n        nodeAffinity:\n", "- key: pool\n", "      tolerations:\n        - effect: NoSchedule\n", "      nodeSelector:\n        kubernetes.io/arch: arm64\n"},
			nots: []string{"podAntiAffinity"}},
		{name: "Pod labels, extra env and volumes", vals: map[string]any{
			"podLabels":         map[string]any{"team": "mesh"},
			"extraEnv":          []any{map[string]any{"name": "AWS_REGION", "value": "eu-west-1"}},
			"extraVolumes":      []any{map[string]any{"name": "proxy-ca", "configMap": map[string]any{"name": "corp-proxy-ca"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "proxy-ca", "mountPath": "/etc/proxy-ca", "readOnly": true}},
		},
			wants: []string{"        app.kubernetes.io/component: onboarding\n        team: mesh\n      annotations:",
				"              resource: limits.cpu\n        - name: GOMEMLIMIT\n          valueFrom:\n            resourceFieldRef:\n              resource: limits.memory\n        - name: AWS_REGION\n          value: eu-west-1\n",
				"        - mountPath: /etc/proxy-ca\n          name: proxy-ca\n          readOnly: true\n      volumes:",
				"          sizeLimit: 64Mi\n      - configMap:\n          name: corp-proxy-ca\n        name: proxy-ca\n"},
			// The selector stays the base's.
			nots: []string{"matchLabels:\n      app.kubernetes.io/name: onboarding-endpoint\n      team: mesh"}},
		{name: "autoscaling", vals: map[string]any{"autoscaling": map[string]any{"enabled": true, "minReplicas": 3, "maxReplicas": 10, "targetCPUUtilizationPercentage": 70}},
			wants: []string{"apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: onboarding-endpoint\n",
				"  scaleTargetRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: onboarding-endpoint\n  minReplicas: 3\n  maxReplicas: 10\n",
				"      name: cpu\n      target:\n        type: Utilization\n        averageUtilization: 70\n"},
			nots: []string{"  replicas:"}},
		{name: "autoscaling min over max", vals: map[string]any{"autoscaling": map[string]any{"enabled": true, "minReplicas": 6, "maxReplicas": 5}},
			wantErr: "autoscaling.minReplicas (6) is greater than autoscaling.maxReplicas (5)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkRender(t, tc.vals, tc.wants, tc.nots, tc.wantErr)
		})
	}
}

// The ServiceAccount carries annotations only when serviceAccount.annotations
// names some.
func TestServiceAccountAnnotations(t *testing.T) {
	serviceAccount := func(vals map[string]any) string {
		t.Helper()
		out, err := Render(chartDir, "embark", "istio-system", vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(out, "---\n") {
			if strings.HasPrefix(doc, "# Source: embark/templates/serviceaccount.yaml\n") {
				return doc
			}
		}
		t.Fatal("no ServiceAccount rendered")
		return ""
	}
	if sa := serviceAccount(nil); strings.Contains(sa, "annotations:") {
		t.Errorf("the default ServiceAccount has annotations:\n%s", sa)
	}
	irsa := map[string]any{"serviceAccount": map[string]any{"annotations": map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/embark"}}}
	if sa := serviceAccount(irsa); !strings.Contains(sa, "  annotations:\n    eks.amazonaws.com/role-arn: arn:aws:iam::111122223333:role/embark\n") {
		t.Errorf("the ServiceAccount lacks the IRSA annotation:\n%s", sa)
	}
}

// The local repository is off by default (no 443 on vmgateway: never the
// gRPC port); on, the configuration serves it on listen.repository :8443,
// the container names that port https-repo and vmgateway's 443 reaches
// it; a signing key Secret is mounted (group-readable only) where
// signingKeyFile points.
func TestLocalRepository(t *testing.T) {
	https443 := "  - name: https\n    port: 443\n    targetPort: https-repo\n    protocol: TCP\n"
	repoPort := "        - name: https-repo\n          containerPort: 8443\n          protocol: TCP\n"
	tests := []struct {
		name  string
		vals  map[string]any
		wants []string
		nots  []string
	}{
		{name: "defaults: off",
			nots: []string{"port: 443", "targetPort: grpc-onboard\n    protocol: TCP\n  - name: https", "localRepository:", "repository: \":8443\"", "containerPort: 8443", "repository-signing-key"}},
		{name: "on without a signing key: package files only", vals: map[string]any{"localRepository": map[string]any{"enabled": true}},
			wants: []string{https443, repoPort, "    localRepository:\n      directory: /var/lib/onboarding-endpoint/repository\n      metadataValidity: 168h\n", "      repository: \":8443\"\n"},
			nots:  []string{"signingKeyFile", "repository-signing-key"}},
		{name: "on with a signing key, directory and validity", vals: map[string]any{"localRepository": map[string]any{"enabled": true,
			"directory": "/srv/packages", "metadataValidity": "48h", "signingKey": map[string]any{"secretName": "repo-key", "key": "key.asc"}}},
			wants: []string{https443, repoPort,
				"    localRepository:\n      directory: /srv/packages\n      signingKeyFile: /etc/onboarding-endpoint-repository-key/key.asc\n      metadataValidity: 48h\n",
				"        - name: repository-signing-key\n          mountPath: /etc/onboarding-endpoint-repository-key\n          readOnly: true\n",
				"      - name: repository-signing-key\n        secret:\n          secretName: repo-key\n          defaultMode: 0440\n          items:\n          - key: key.asc\n            path: key.asc\n"}},
		{name: "Istio's sidecar packages from volumes", vals: map[string]any{"localRepository": map[string]any{"enabled": true, "extraSources": []any{
			map[string]any{"name": "istio-sidecar", "volume": map[string]any{"persistentVolumeClaim": map[string]any{"claimName": "sidecar-pkgs", "readOnly": true}}},
			map[string]any{"name": "canary", "volume": map[string]any{"image": map[string]any{"reference": "registry.example.corp/istio-sidecar-packages:1.31.0"}}},
		}}},
			wants: []string{"      extraDirectories:\n      - /var/lib/onboarding-endpoint/repository-sources/istio-sidecar\n      - /var/lib/onboarding-endpoint/repository-sources/canary\n",
				"        - name: repository-istio-sidecar\n          mountPath: /var/lib/onboarding-endpoint/repository-sources/istio-sidecar\n          readOnly: true\n",
				"      - name: repository-istio-sidecar\n        persistentVolumeClaim:\n          claimName: sidecar-pkgs\n          readOnly: true\n",
				"      - name: repository-canary\n        image:\n          reference: registry.example.corp/istio-sidecar-packages:1.31.0\n"}},
		{name: "extra sources while the repository is off", vals: map[string]any{"localRepository": map[string]any{"extraSources": []any{
			map[string]any{"name": "istio-sidecar", "volume": map[string]any{"persistentVolumeClaim": map[string]any{"claimName": "sidecar-pkgs"}}}}}},
			nots: []string{"repository-istio-sidecar", "sidecar-pkgs", "extraDirectories"}},
		{name: "a signing key Secret named but the repository off", vals: map[string]any{"localRepository": map[string]any{"signingKey": map[string]any{"secretName": "repo-key"}}},
			nots: []string{"repo-key", "port: 443", "signingKeyFile"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkRender(t, tc.vals, tc.wants, tc.nots, "")
		})
	}
	twice := map[string]any{"localRepository": map[string]any{"enabled": true, "extraSources": []any{
		map[string]any{"name": "pkgs", "volume": map[string]any{"emptyDir": map[string]any{}}},
		map[string]any{"name": "pkgs", "volume": map[string]any{"configMap": map[string]any{"name": "x"}}}}}}
	checkRender(t, twice, nil, nil, `localRepository.extraSources: the name "pkgs" is used twice`)
}

// The endpoint settings the chart exposes reach its configuration file
// only when set; unset, the endpoint's defaults apply.
func TestEndpointSettings(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		wants []string
		nots  []string
	}{
		{name: "defaults: none rendered", nots: []string{"outOfTrafficAfter", "detailedDenialSources", "maxCertificateValidity", "\n    limits:\n      xds:", "maxSubscribed", "revisions:", "resources: [namespaces]", "certificateRelay"}},
		{name: "istiod revisions", vals: map[string]any{"istiod": map[string]any{"revisions": []any{
			map[string]any{"name": "canary"},
			map[string]any{"name": "1-26-0", "address": "istiod-next.mesh.svc:15012", "serverName": "istiod.mesh.svc"},
		}}}, wants: []string{
			"      rootCertFile: /etc/istio-root/root-cert.pem\n      revisions:\n" +
				"      - name: canary\n        address: istiod-canary.istio-system.svc:15012\n        serverName: istiod-canary.istio-system.svc\n" +
				"      - name: 1-26-0\n        address: istiod-next.mesh.svc:15012\n        serverName: istiod.mesh.svc\n",
			"- apiGroups: [\"\"]\n  resources: [namespaces]\n  verbs: [get, list, watch]\n",
		}},
		{name: "every one set", vals: map[string]any{
			"registration":          map[string]any{"outOfTrafficAfter": "30s"},
			"detailedDenialSources": []any{"10.0.0.0/8", "2001:db8::/32"},
			"limits":                map[string]any{"xds": map[string]any{"maxSubscribedNamesPerType": 5000, "maxSubscribedNameBytesPerStream": 2 << 20}},
			"istiod":                map[string]any{"maxCertificateValidity": "12h", "certificateRelay": map[string]any{"requestsPerSecond": 200, "burst": 500, "maxInFlight": 256}},
		}, wants: []string{
			"      secretName: onboarding-endpoint-tls\n      detailedDenialSources:\n      - 10.0.0.0/8\n      - 2001:db8::/32\n",
			"      rootCertFile: /etc/istio-root/root-cert.pem\n      maxCertificateValidity: 12h\n      certificateRelay:\n        requestsPerSecond: 200\n        burst: 500\n        maxInFlight: 256\n",
			"    registration:\n      gracePeriod: 5m\n      outOfTrafficAfter: 30s\n",
			"    limits:\n      xds:\n        maxSubscribedNamesPerType: 5000\n        maxSubscribedNameBytesPerStream: 2097152\n",
		}},
		{name: "one xds limit", vals: map[string]any{"limits": map[string]any{"xds": map[string]any{"maxSubscribedNameBytesPerStream": 65536}}},
			wants: []string{"    limits:\n      xds:\n        maxSubscribedNameBytesPerStream: 65536\n"}, nots: []string{"maxSubscribedNamesPerType"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkRender(t, tc.vals, tc.wants, tc.nots, "")
		})
	}
}

// The PodDisruptionBudget, the Pods' annotations, image pull secrets and
// pull policy follow their values.
func TestPodDisruptionBudgetAndImageOptions(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		wants []string
		nots  []string
	}{
		{name: "defaults", wants: []string{"kind: PodDisruptionBudget\nmetadata:\n  name: onboarding-endpoint\n", "  minAvailable: 1\n", "imagePullPolicy: IfNotPresent\n"},
			nots: []string{"imagePullSecrets"}},
		{name: "a percentage", vals: map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": "50%"}}, wants: []string{"  minAvailable: 50%\n"}},
		{name: "off", vals: map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}}, nots: []string{"kind: PodDisruptionBudget"}},
		{name: "annotations, pull secrets and policy", vals: map[string]any{
			"podAnnotations":   map[string]any{"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
			"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
			"image":            map[string]any{"repository": "registry.example.corp/embark", "pullPolicy": "Always"},
		}, wants: []string{"        checksum/config: ", "        cluster-autoscaler.kubernetes.io/safe-to-evict: \"true\"\n",
			"      imagePullSecrets:\n        - name: regcred\n", "        imagePullPolicy: Always\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkRender(t, tc.vals, tc.wants, tc.nots, "")
		})
	}
}

// checkRender renders vals and checks the output has every want and no
// not, or, with wantErr, that rendering fails with that message.
func checkRender(t *testing.T, vals map[string]any, wants, nots []string, wantErr string) {
	t.Helper()
	out, err := Render(chartDir, "embark", "istio-system", vals)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Render: %v, want an error containing %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("rendered chart lacks %q", w)
		}
	}
	for _, n := range nots {
		if strings.Contains(out, n) {
			t.Errorf("rendered chart has %q", n)
		}
	}
}

// A configuration change changes the Pod template's checksum annotation,
// so the Deployment rolls; an unrelated value does not.
func TestConfigChecksumRollsPods(t *testing.T) {
	checksum := func(vals map[string]any) string {
		t.Helper()
		out, err := Render(chartDir, "embark", "istio-system", vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(out, "\n") {
			if s, ok := strings.CutPrefix(strings.TrimSpace(l), "checksum/config: "); ok {
				return s
			}
		}
		t.Fatal("no checksum/config annotation")
		return ""
	}
	base := checksum(nil)
	if got := checksum(map[string]any{"registration": map[string]any{"gracePeriod": "10m"}}); got == base {
		t.Error("changing registration.gracePeriod left the checksum as it was")
	}
	if got := checksum(map[string]any{"replicas": 3}); got != base {
		t.Error("changing replicas changed the configuration checksum")
	}
}

// version is the repository's release version (its VERSION file): the
// chart's appVersion, the default image tag.
func version(t *testing.T) string {
	t.Helper()
	v, err := os.ReadFile("../../../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}
