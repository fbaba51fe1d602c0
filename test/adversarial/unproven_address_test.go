package adversarial

import (
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/test/fixtures"
)

// A genuine EC2 instance (its document proves 10.0.0.30) registers with a
// second address its document does not prove and no addressCIDRs allows:
// stored, it would be an address the registration claims (and, before the
// xDS server required the proven one, one its sidecar could name in its node
// ID). The Register must be refused naming the field, nothing stored; with
// a rule listing the address in addressCIDRs the same Register is accepted.
func TestRegisterStoresAnUnprovenExtraAddress(t *testing.T) {
	Attack(t, "Register stores an extra host address neither the identity nor addressCIDRs proves")
	h := newOnboarding(t, onboardingOptions{})
	h.policy("any-ec2", anyEC2())
	h.group("ratings")
	vm := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa31", PrivateIP: "10.0.0.30"})
	register := func() (*onboardingv1alpha1.RegisterResponse, error) {
		auth, err := h.authorizeAWS("ratings", vm, false)
		if err != nil {
			t.Fatal(err)
		}
		return h.client.Register(h.call(auth.GetToken(), ""), &onboardingv1alpha1.RegisterRequest{
			Addresses:     []*onboardingv1alpha1.HostAddress{{Ip: "10.0.0.30", Type: "VPC"}, {Ip: "10.9.9.9", Type: "INTERNET"}},
			ConnectedOver: "VPC",
			AgentVersion:  "v1.4.0",
		})
	}
	_, err := register()
	wantCode(t, "an extra unproven address", err, codes.PermissionDenied, "registration.host.addresses[1].ip", "10.9.9.9", "not proven")
	assertNoRegistrations(t, h.ns)

	// The operator vouches for the address: a rule allowing the instance
	// lists it in addressCIDRs.
	rule := anyEC2()
	rule.AddressCIDRs = []authorizationv1alpha1.CIDR{"10.9.9.0/24"}
	h.policy("public-addresses", rule)
	res, err := register()
	if err != nil {
		t.Fatalf("with 10.9.9.0/24 in addressCIDRs: %v", err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: h.ns, Name: res.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	if got := war.Spec.Registration.Host.Addresses; len(got) != 2 || got[1].IP != "10.9.9.9" {
		t.Errorf("stored addresses %v, want 10.0.0.30 and 10.9.9.9", got)
	}
}

// A registration holds an address besides its proven workload address (as
// one stored before every address was checked does). Its genuine sidecar
// token connects with a node ID naming that other address: istiod would
// take the proxy for whatever workload holds it. The stream must be refused
// PERMISSION_DENIED; the node ID naming the proven address connects.
func TestNodeIDNamesAnUnprovenAddress(t *testing.T) {
	Attack(t, "xDS: a genuine sidecar token connects with a node ID naming an address its identity never proved")
	p := startXDS(t, limits.Options{})
	ns := env.Namespace(t)
	wg := fixtures.WorkloadGroup(ns, nil)
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: p.cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stored := fixtures.Registration("10.1.3.1")
	stored.Host.Addresses = append(stored.Host.Addresses, runtimev1alpha1.HostAddress{IP: "10.9.9.9", Type: runtimev1alpha1.AddressTypeInternet})
	res, err := reg.Write(t.Context(), registry.Request{Group: wg, Identity: fixtures.AWSIdentity("i-0aaaaaaaaaaaaaa32"), Registration: stored, AddressProven: true})
	if err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: ns, Name: res.Registration.Name}
	token := res.SidecarToken.Token
	conn := dialFrom(t, "127.0.0.1", p.addr)

	_, err = openADS(t.Context(), conn, token, nodeOf(nodeid.Build("10.9.9.9", key)))
	wantCode(t, "node ID naming 10.9.9.9", err, codes.PermissionDenied, "10.9.9.9", "10.1.3.1")
	if _, err := openADS(t.Context(), conn, token, nodeOf(nodeid.Build("10.1.3.1", key))); err != nil {
		t.Fatalf("node ID naming the proven address 10.1.3.1: %v", err)
	}
}
