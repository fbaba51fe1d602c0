package adversarial

import (
	"maps"
	"testing"

	"google.golang.org/grpc/codes"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/registry"
)

// An authorized VM reports labels its WorkloadGroup does not give it: a
// label another Service selects (tier: payments), one its group sets to
// another value (app), or Istio's own keys (mTLS mode, locality, canonical
// service). Any of them on its WorkloadEntry would make it an endpoint of
// another service (istiod puts every entry whose labels match a Service's
// selector into that Service's endpoints) or change how the mesh treats it.
// Each is refused with INVALID_ARGUMENT naming the key, nothing is written,
// and the label the group allows by default (version) still works.
func TestLabelInjectionIntoAnotherService(t *testing.T) {
	Attack(t, "an authorized VM reports labels that put it behind another Service or set Istio's own keys")
	h := newOnboarding(t, onboardingOptions{})
	h.policy("any-ec2", anyEC2())
	h.group("ratings")
	vm := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaab01", PrivateIP: "10.0.0.40"})

	register := func(labels map[string]string) (*onboardingv1alpha1.RegisterResponse, error) {
		auth, err := h.authorizeAWS("ratings", vm, false)
		if err != nil {
			t.Fatal(err)
		}
		return h.client.Register(h.call(auth.GetToken(), ""), &onboardingv1alpha1.RegisterRequest{
			Addresses:     []*onboardingv1alpha1.HostAddress{{Ip: "10.0.0.40", Type: "VPC"}},
			ConnectedOver: "VPC", AgentVersion: "v1.4.0", Labels: labels,
		})
	}
	for _, tc := range []struct {
		key, value string
		says       string
	}{
		{"tier", "payments", "does not let its workloads set tier"},
		{"app", "payments", "sets app=ratings"},
		{"class", "db", "sets class=vm"},
		{"security.istio.io/tlsMode", "disabled", "reserved"},
		{"istio-locality", "us-east-1.us-east-1a", "reserved"},
		{"service.istio.io/canonical-name", "payments", "reserved"},
		{"app.kubernetes.io/name", "payments", "reserved"},
		{"topology.istio.io/network", "pods", "reserved"},
		{"istio.io/rev", "canary", "reserved"},
		{"hostname", "payments-0", "reserved"},
	} {
		_, err := register(map[string]string{"version": "v5", tc.key: tc.value})
		wantCode(t, tc.key+"="+tc.value, err, codes.InvalidArgument, "labels["+tc.key+"]", tc.says)
	}
	assertNoRegistrations(t, h.ns)

	reg, err := register(map[string]string{"version": "v5"})
	if err != nil {
		t.Fatalf("version, allowed by default: %v", err)
	}
	we, err := h.workloadEntry(h.ns, reg.GetRegistrationName())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"app": "ratings", "class": "vm", "version": "v5",
		registry.LabelNetwork: "virtual-machines", registry.LabelHostname: "ip-10-0-0-40",
		registry.LabelCanonicalName: "ratings", registry.LabelCanonicalRevision: "v5",
	}
	if !maps.Equal(we.Labels, want) || !maps.Equal(we.Spec.Labels, want) {
		t.Errorf("WorkloadEntry labels %v, spec labels %v; want %v", we.Labels, we.Spec.Labels, want)
	}
}
