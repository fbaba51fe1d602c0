package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/registry"
	demovm "github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
)

// A Compute Engine instance onboards with its instance identity token: the
// real agent (platform gce) fetches a format=full token for the endpoint's
// audience from a loopback metadata server, the real endpoint verifies it
// against a loopback Google JWKS (identity.gce.jwksURL) and the policy's gcp
// rule allows it; its address is allowed by the rule's addressCIDRs, as a
// GCE token proves none. kubectl describe war shows the GCE identity.
func TestGCEInstanceOnboards(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	google, err := gcetest.NewGoogle()
	must(t, err)
	t.Cleanup(google.Close)
	inst := gcetest.DefaultInstance()
	md := gcetest.NewMetadataServer(google, inst)
	t.Cleanup(md.Close)

	googleCA := filepath.Join(w.dir, "google-ca.pem")
	must(t, os.WriteFile(googleCA, google.CACertificates(), 0o600))
	w.cfg.Identity.GCE = &endpointconfig.GCEIdentity{JWKSURL: google.JWKSURL(), CAFile: googleCA}
	policy := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "gce", Namespace: w.ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{GCP: &authorizationv1alpha1.GCPMatcher{
				Projects: []string{inst.ProjectID}, Zones: []string{inst.Zone},
				ServiceAccounts: []string{inst.ServiceAccount}, InstanceNamePatterns: []string{"ratings-*"},
			}}},
			AddressCIDRs: []authorizationv1alpha1.CIDR{"10.128.0.0/20"},
			OnboardTo:    []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}
	must(t, env.Client.Create(ctx, policy))
	w.startEndpoint()

	w.runAgent(agentRun{agentFiles: agentFiles{platform: demovm.GCEHost(md.URL())}})

	fixtures.Eventually(t, 60*time.Second, "the GCE instance registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	want := runtimev1alpha1.GCPIdentity{
		ProjectID: inst.ProjectID, ProjectNumber: "123456789012", Zone: inst.Zone,
		InstanceID: inst.InstanceID, InstanceName: inst.InstanceName, ServiceAccount: inst.ServiceAccount,
	}
	if id := war.Spec.Identity.GCP; id == nil || *id != want || war.Spec.Identity.AWS != nil || war.Spec.Identity.JWT != nil {
		t.Fatalf("registration identity %+v, want gcp %+v", war.Spec.Identity, want)
	}
	if wantName := "ratings-gcp-embark-test-us-central1-a-gce-5180367924151823417"; war.Name != wantName || war.Name != registry.Name("ratings", war.Spec.Identity) {
		t.Errorf("registration name %s, want %s", war.Name, wantName)
	}
	if addrs := war.Spec.Registration.Host.Addresses; len(addrs) != 1 || addrs[0].IP != inst.IP {
		t.Errorf("addresses %+v, want the metadata server's %s", addrs, inst.IP)
	}
	if md.Issued() == 0 {
		t.Error("the agent did not ask the metadata server for a token")
	}

	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", w.ns, war.Name)
	must(t, err)
	for _, f := range [][2]string{
		{"Project Id", inst.ProjectID}, {"Project Number", "123456789012"}, {"Zone", inst.Zone},
		{"Instance Id", inst.InstanceID}, {"Instance Name", inst.InstanceName}, {"Service Account", inst.ServiceAccount},
	} {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(f[0]) + `:\s+` + regexp.QuoteMeta(f[1]) + `$`).MatchString(desc) {
			t.Errorf("kubectl describe war lacks %q: %q:\n%s", f[0], f[1], desc)
		}
	}
}

// With identity.gce.instanceCheck the endpoint asks a loopback Compute API
// about the instance (with the credentials of a service account key whose
// token endpoint is the fake's, through Google's own credentials code): the
// policy lists no addressCIDRs, and the WorkloadEntry's address is the
// Compute API's networkIP of nic0, which the real agent reported from the
// metadata server. kubectl describe war shows the instance confirmed.
func TestGCEInstanceCheckProvesTheAddress(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	google, err := gcetest.NewGoogle()
	must(t, err)
	t.Cleanup(google.Close)
	compute := gcetest.NewComputeAPI()
	t.Cleanup(compute.Close)
	inst := gcetest.DefaultInstance()
	inst.IP = "10.128.0.42"
	compute.PutInstance(inst)
	md := gcetest.NewMetadataServer(google, inst)
	t.Cleanup(md.Close)

	googleCA := filepath.Join(w.dir, "google-ca.pem")
	must(t, os.WriteFile(googleCA, google.CACertificates(), 0o600))
	key, err := compute.ServiceAccountKey()
	must(t, err)
	keyFile := filepath.Join(w.dir, "gcp-key.json")
	must(t, os.WriteFile(keyFile, key, 0o600))
	w.cfg.Identity.GCE = &endpointconfig.GCEIdentity{JWKSURL: google.JWKSURL(), CAFile: googleCA,
		InstanceCheck: &endpointconfig.GCEInstanceCheck{ComputeEndpoint: compute.URL(), CredentialsFile: keyFile}}
	must(t, env.Client.Create(ctx, &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "gce", Namespace: w.ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{GCP: &authorizationv1alpha1.GCPMatcher{Projects: []string{inst.ProjectID}}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}))
	w.startEndpoint()

	w.runAgent(agentRun{agentFiles: agentFiles{platform: demovm.GCEHost(md.URL())}})

	fixtures.Eventually(t, 60*time.Second, "the GCE instance registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	if id := war.Spec.Identity.GCP; id == nil || !id.InstanceConfirmed || id.InstanceID != inst.InstanceID {
		t.Fatalf("registration identity %+v, want the instance, confirmed", war.Spec.Identity)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	fixtures.Eventually(t, 30*time.Second, "the WorkloadEntry exists", func() bool {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: war.Name}, we) == nil
	})
	if we.Spec.Address != "10.128.0.42" {
		t.Errorf("WorkloadEntry address %q, want the Compute API's networkIP 10.128.0.42", we.Spec.Address)
	}
	if compute.Calls() == 0 || compute.TokensIssued() == 0 {
		t.Errorf("Compute API calls %d, access tokens issued %d: want the instance checked with the key's token", compute.Calls(), compute.TokensIssued())
	}
	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", w.ns, war.Name)
	must(t, err)
	if !regexp.MustCompile(`(?m)^\s*Instance Confirmed:\s+true$`).MatchString(desc) {
		t.Errorf("kubectl describe war does not show Instance Confirmed: true:\n%s", desc)
	}
}
