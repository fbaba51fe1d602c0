package registry

import (
	"maps"
	"strings"
	"testing"

	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func decodeGroup(t *testing.T, doc string) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	g := &istionetworkingv1.WorkloadGroup{}
	if err := yaml.UnmarshalStrict([]byte(doc), g); err != nil {
		t.Fatal(err)
	}
	return g
}

func registrationFor(t *testing.T, g *istionetworkingv1.WorkloadGroup, id runtimev1alpha1.WorkloadIdentity, agent map[string]string) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	snap, err := Snapshot(g)
	if err != nil {
		t.Fatal(err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	war.Name, war.Namespace = g.Name+"-x", g.Namespace
	war.Spec.Identity = id
	war.Spec.WorkloadGroup = snap
	war.Spec.Registration.Host.Addresses = []runtimev1alpha1.HostAddress{{IP: "172.31.22.226", Type: runtimev1alpha1.AddressTypeVPC}}
	war.Spec.Registration.Workload.Labels = agent
	return war
}

var ec2Identity = runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
	Partition: "aws", Account: "123456789012", Region: "eu-central-1", Zone: "eu-central-1a",
	EC2: &runtimev1alpha1.EC2Identity{InstanceID: "i-1234567890abcdef0"},
}}

// The entry of Istio's documented group carries what Istio's own
// auto-registration gives it: the spec.metadata labels, the network, the
// host name and the canonical service labels, and its annotations.
func TestWorkloadEntryOfTheDocumentedGroup(t *testing.T) {
	g := decodeGroup(t, fixtures.AnalyticsGroup)
	g.Spec.Metadata.Annotations = map[string]string{
		"example.com/owner":              "team-a",
		"istio.io/autoRegistrationGroup": "analytics-v1",                   // istiod's: would make it delete the entry
		AnnotationWorkloadGroup:          "someone-else",                   // Embark's own
		AnnotationHealthChecksEnabled:    "false",                          // Embark's own
		"onboarding.tetrate.io/x":        "y",                              // Embark's domain
		"sub.onboarding.tetrate.io/x":    "y",                              // Embark's domain
		"istio.io/connectedAt":           "2022-03-31T06:52:14.739292073Z", // istiod's
	}
	war := registrationFor(t, g, ec2Identity, nil)
	we, err := BuildWorkloadEntry(war)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"app":                  "analytics",
		"version":              "v1",
		LabelHostname:          "ip-172-31-22-226",
		LabelCanonicalName:     "analytics",
		LabelCanonicalRevision: "v1",
		LabelNetwork:           "vm-network-1",
	}
	if !maps.Equal(we.Labels, want) || !maps.Equal(we.Spec.Labels, want) {
		t.Errorf("labels:\n got %v\n spec %v\nwant %v", we.Labels, we.Spec.Labels, want)
	}
	wantAnn := map[string]string{
		"example.com/owner":              "team-a",
		AnnotationWorkloadGroup:          "analytics-v1",
		AnnotationRegistrationGeneration: "0",
		AnnotationHealthChecksEnabled:    "true",
	}
	if !maps.Equal(we.Annotations, wantAnn) {
		t.Errorf("annotations:\n got %v\nwant %v", we.Annotations, wantAnn)
	}
	if we.Spec.Network != "vm-network-1" || we.Spec.Locality != "eu-central-1/eu-central-1a" || we.Spec.ServiceAccount != "default" {
		t.Errorf("spec: network %q locality %q service account %q", we.Spec.Network, we.Spec.Locality, we.Spec.ServiceAccount)
	}
}

func TestWorkloadLabels(t *testing.T) {
	group := func(tmpl, meta map[string]string, network string) *istionetworkingv1.WorkloadGroup {
		g := &istionetworkingv1.WorkloadGroup{}
		g.Name, g.Namespace = "ratings", "bookinfo"
		g.Spec.Template = &istioapi.WorkloadEntry{Labels: tmpl, Network: network}
		if meta != nil {
			g.Spec.Metadata = &istioapi.WorkloadGroup_ObjectMeta{Labels: meta}
		}
		return g
	}
	onPrem := runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: "https://idp", Subject: "vm-01.example.com"}}
	saSubject := runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: "https://k8s", Subject: "system:serviceaccount:ns:vm"}}
	for _, tc := range []struct {
		name  string
		group *istionetworkingv1.WorkloadGroup
		id    runtimev1alpha1.WorkloadIdentity
		agent map[string]string
		want  map[string]string
	}{{
		name:  "template only, no app: canonical name is the group's",
		group: group(map[string]string{"tier": "db"}, nil, ""),
		id:    ec2Identity,
		want:  map[string]string{"tier": "db", LabelHostname: "ip-172-31-22-226", LabelCanonicalName: "ratings", LabelCanonicalRevision: "latest"},
	}, {
		name:  "spec.metadata wins over the template",
		group: group(map[string]string{"app": "old", "tier": "db"}, map[string]string{"app": "ratings", "version": "v2"}, "net-a"),
		id:    onPrem,
		want: map[string]string{"app": "ratings", "version": "v2", "tier": "db", LabelNetwork: "net-a", LabelHostname: "vm-01.example.com",
			LabelCanonicalName: "ratings", LabelCanonicalRevision: "v2"},
	}, {
		name:  "an agent's allowed label adds; it names the canonical revision",
		group: group(map[string]string{"app": "ratings"}, nil, ""),
		id:    saSubject,
		agent: map[string]string{"version": "v5"},
		want:  map[string]string{"app": "ratings", "version": "v5", LabelCanonicalName: "ratings", LabelCanonicalRevision: "v5"},
	}, {
		name:  "stored agent labels never override the group nor set reserved keys",
		group: group(map[string]string{"app": "ratings"}, nil, "net-a"),
		id:    saSubject,
		agent: map[string]string{"app": "payments", "security.istio.io/tlsMode": "disabled", LabelNetwork: "pods", "istio-locality": "x"},
		want:  map[string]string{"app": "ratings", LabelNetwork: "net-a", LabelCanonicalName: "ratings", LabelCanonicalRevision: "latest"},
	}, {
		name: "the group's explicit canonical labels are kept; owned labels win over the group's",
		group: group(map[string]string{"app": "ratings", LabelCanonicalName: "ratings-vm", LabelCanonicalRevision: "r7",
			LabelHostname: "fake", LabelNetwork: "other"}, nil, "net-a"),
		id:   ec2Identity,
		want: map[string]string{"app": "ratings", LabelCanonicalName: "ratings-vm", LabelCanonicalRevision: "r7", LabelHostname: "ip-172-31-22-226", LabelNetwork: "net-a"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			war := registrationFor(t, tc.group, tc.id, tc.agent)
			if got := WorkloadLabels(war, &tc.group.Spec); !maps.Equal(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestValidateAgentLabels(t *testing.T) {
	group := func(ann map[string]string) *istionetworkingv1.WorkloadGroup {
		g := decodeGroup(t, fixtures.AnalyticsGroup)
		g.Spec.Template.Labels = map[string]string{"tier": "analytics"}
		g.Annotations = ann
		return g
	}
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		labels map[string]string
		// refused is the label key each error names, in order; none: accepted.
		refused []string
		detail  string
	}{
		{name: "version is allowed by default", labels: map[string]string{"version": "v1"}},
		{name: "the group's own value changes nothing", labels: map[string]string{"app": "analytics", "tier": "analytics"}},
		{name: "a label no one allowed", labels: map[string]string{"tier2": "payments"}, refused: []string{"tier2"}, detail: "allowed: version"},
		{name: "a key the template sets, other value", labels: map[string]string{"tier": "payments"}, refused: []string{"tier"}, detail: "sets tier=analytics"},
		{name: "a key spec.metadata sets, other value", labels: map[string]string{"app": "payments"}, refused: []string{"app"}, detail: "sets app=analytics"},
		{name: "a metadata key with another version", labels: map[string]string{"version": "v5"}, refused: []string{"version"}, detail: "sets version=v1"},
		{
			name:    "Istio's own keys, even when the group allows them",
			ann:     map[string]string{AnnotationAgentLabels: "security.istio.io/tlsMode, istio-locality, service.istio.io/canonical-name, app.kubernetes.io/name, istio.io/rev, hostname, istio, onboarding.tetrate.io/x"},
			labels:  map[string]string{"security.istio.io/tlsMode": "disabled", "istio-locality": "a.b", "service.istio.io/canonical-name": "payments", "app.kubernetes.io/name": "payments", "istio.io/rev": "canary", "hostname": "h", "istio": "ingressgateway", "onboarding.tetrate.io/x": "y"},
			refused: []string{"app.kubernetes.io/name", "hostname", "istio", "istio-locality", "istio.io/rev", "onboarding.tetrate.io/x", "security.istio.io/tlsMode", "service.istio.io/canonical-name"},
			detail:  "reserved",
		},
		{name: "the group's allow-list replaces the default", ann: map[string]string{AnnotationAgentLabels: "rack,build"}, labels: map[string]string{"rack": "r1", "build": "42", "zone-x": "z"}, refused: []string{"zone-x"}, detail: "allowed: rack, build"},
		{name: "an empty allow-list allows none", ann: map[string]string{AnnotationAgentLabels: ""}, labels: map[string]string{"rack": "r1"}, refused: []string{"rack"}, detail: "allowed: none"},
		{name: "an invalid key", ann: map[string]string{AnnotationAgentLabels: "bad key"}, labels: map[string]string{"bad key": "v"}, refused: []string{"bad key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := validateAgentLabels(field.NewPath("registration", "workload", "labels"), tc.labels, group(tc.ann))
			var got []string
			for _, e := range errs {
				got = append(got, strings.TrimSuffix(strings.TrimPrefix(e.Field, "registration.workload.labels["), "]"))
			}
			if strings.Join(got, "|") != strings.Join(tc.refused, "|") {
				t.Fatalf("refused %q, want %q (%v)", got, tc.refused, errs)
			}
			if tc.detail != "" && !strings.Contains(errs.ToAggregate().Error(), tc.detail) {
				t.Errorf("message %q does not say %q", errs.ToAggregate().Error(), tc.detail)
			}
		})
	}
}

func TestHostnameOf(t *testing.T) {
	for _, tc := range []struct {
		id    runtimev1alpha1.WorkloadIdentity
		addrs []runtimev1alpha1.HostAddress
		want  string
	}{
		{ec2Identity, []runtimev1alpha1.HostAddress{{IP: "3.67.91.181", Type: runtimev1alpha1.AddressTypeInternet}, {IP: "10.0.0.7", Type: runtimev1alpha1.AddressTypeVPC}}, "ip-10-0-0-7"},
		{ec2Identity, []runtimev1alpha1.HostAddress{{IP: "fd00::7", Type: runtimev1alpha1.AddressTypeVPC}}, ""},
		{runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Subject: "vm-01.example.com"}}, nil, "vm-01.example.com"},
		{runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Subject: "system:serviceaccount:a:b"}}, nil, ""},
		{runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{InstanceName: "ratings-1"}}, []runtimev1alpha1.HostAddress{{IP: "10.128.0.7", Type: runtimev1alpha1.AddressTypeVPC}}, "ratings-1"},
		{runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{VMName: "ratings-1"}}, []runtimev1alpha1.HostAddress{{IP: "10.1.0.4", Type: runtimev1alpha1.AddressTypeVPC}}, "ratings-1"},
		{runtimev1alpha1.WorkloadIdentity{}, nil, ""},
	} {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		war.Spec.Identity, war.Spec.Registration.Host.Addresses = tc.id, tc.addrs
		if got := HostnameOf(war); got != tc.want {
			t.Errorf("HostnameOf(%+v, %+v) = %q, want %q", tc.id, tc.addrs, got, tc.want)
		}
	}
}

// An entry never carries istio.io/rev: not the revision recorded on the
// registration, nor a group's spec.metadata or template label (Istio's
// auto-registration would copy those; on an Embark entry they would hide the
// VM from every other revision's istiod).
func TestWorkloadLabelsRevision(t *testing.T) {
	g := decodeGroup(t, fixtures.AnalyticsGroup)
	g.Spec.Metadata.Labels[LabelRevision] = "stable"
	war := registrationFor(t, g, ec2Identity, nil)
	if got, ok := WorkloadLabels(war, &g.Spec)[LabelRevision]; ok {
		t.Errorf("group's spec.metadata.labels istio.io/rev=stable: entry labelled istio.io/rev=%q", got)
	}
	delete(g.Spec.Metadata.Labels, LabelRevision)
	g.Spec.Template.Labels = map[string]string{LabelRevision: "stable", "tier": "db"}
	war.Annotations = map[string]string{AnnotationIstioRevision: "canary"}
	labels := WorkloadLabels(war, &g.Spec)
	if got, ok := labels[LabelRevision]; ok {
		t.Errorf("template istio.io/rev=stable, recorded revision canary: entry labelled istio.io/rev=%q", got)
	}
	if labels["tier"] != "db" {
		t.Errorf("the template's other labels: tier=%q, want db", labels["tier"])
	}
	for in, want := range map[string]string{"": "", "default": "", "canary": "canary"} {
		if got := revisionOf(in); got != want {
			t.Errorf("revisionOf(%q) = %q, want %q", in, got, want)
		}
	}
}
