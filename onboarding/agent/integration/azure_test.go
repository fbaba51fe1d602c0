package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/vmsim"
)

// An Azure VM onboards with its managed identity token: the real agent
// (platform azure) fetches a token for the endpoint's resource
// (api://embark-onboarding) from a loopback Instance Metadata Service, the
// real endpoint verifies it against a loopback Entra ID key endpoint
// (identity.azure.jwksURL) for the allowed tenant and the policy's azure
// rule allows it; its address is allowed by the rule's addressCIDRs, as the
// token proves none. kubectl describe war shows the Azure identity.
func TestAzureVMOnboards(t *testing.T) {
	w := newWorld(t)
	ms, err := azuretest.NewMicrosoft()
	must(t, err)
	t.Cleanup(ms.Close)
	vm := azuretest.DefaultVM()
	imds := azuretest.NewIMDS(ms, vm)
	t.Cleanup(imds.Close)
	startAzureAgent(t, w, ms, imds, vm, 0)
	ctx := t.Context()

	fixtures.Eventually(t, 60*time.Second, "the Azure VM registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	want := runtimev1alpha1.AzureIdentity{
		TenantID: vm.TenantID, SubscriptionID: vm.SubscriptionID, ResourceGroup: "embark-rg",
		VMName: vm.Name, PrincipalID: vm.PrincipalID,
	}
	if id := war.Spec.Identity.Azure; id == nil || *id != want || war.Spec.Identity.AWS != nil || war.Spec.Identity.JWT != nil || war.Spec.Identity.GCP != nil {
		t.Fatalf("registration identity %+v, want azure %+v", war.Spec.Identity, want)
	}
	if wantName := "ratings-azure-" + vm.SubscriptionID + "-embark-rg-vm-ratings-1"; war.Name != wantName || war.Name != registry.Name("ratings", war.Spec.Identity) {
		t.Errorf("registration name %s, want %s", war.Name, wantName)
	}
	if addrs := war.Spec.Registration.Host.Addresses; len(addrs) != 1 || addrs[0].IP != vm.IP {
		t.Errorf("addresses %+v, want the metadata service's %s", addrs, vm.IP)
	}
	if imds.Issued() == 0 {
		t.Error("the agent did not ask the metadata service for a token")
	}

	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", w.ns, war.Name)
	must(t, err)
	for _, f := range [][2]string{
		{"Tenant Id", vm.TenantID}, {"Subscription Id", vm.SubscriptionID}, {"Resource Group", "embark-rg"},
		{"Vm Name", vm.Name}, {"Principal Id", vm.PrincipalID},
	} {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(f[0]) + `:\s+` + regexp.QuoteMeta(f[1]) + `$`).MatchString(desc) {
			t.Errorf("kubectl describe war lacks %q: %q:\n%s", f[0], f[1], desc)
		}
	}
}

// Azure's Instance Metadata Service hands the agent the token it onboarded
// with again for most of a day: the agent's renewals of its onboarding
// token re-present it, with the agent's onboarding token and session, and
// the endpoint accepts it as that session's renewal. The VM stays
// onboarded past its first onboarding token's expiry: its sidecar token is
// renewed with the renewed onboarding token.
func TestAzureVMRenewsWithCachedToken(t *testing.T) {
	w := newWorld(t)
	ms, err := azuretest.NewMicrosoft()
	must(t, err)
	t.Cleanup(ms.Close)
	vm := azuretest.DefaultVM()
	imds := azuretest.NewCachingIMDS(ms, vm)
	t.Cleanup(imds.Close)
	// 1m onboarding tokens renewed after 6s; 1h sidecar tokens after ~11s.
	logs := startAzureAgent(t, w, ms, imds, vm, 0.1)

	fixtures.Eventually(t, 60*time.Second, "the Azure VM registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	// The first onboarding token (1m) is refused from then on, clock skew
	// leeway included.
	firstExpiry := time.Now().Add(time.Minute + token.DefaultLeeway)
	fixtures.Eventually(t, 2*time.Minute, "the first onboarding token expired", func() bool { return time.Now().After(firstExpiry) })
	sidecarRenewals := strings.Count(logs.String(), "sidecar token renewed")
	fixtures.Eventually(t, 60*time.Second, "a sidecar token renewed after the first onboarding token expired", func() bool {
		return strings.Count(logs.String(), "sidecar token renewed") > sidecarRenewals
	})
	l := logs.String()
	if n := strings.Count(l, "onboarding token renewed"); n < 2 {
		t.Errorf("onboarding token renewed %d times, want at least 2", n)
	}
	if strings.Contains(l, "Replayed") {
		t.Errorf("a renewal was refused as a replay:\n%s", l)
	}
	if imds.Issued() != 1 || imds.Served() < 3 {
		t.Errorf("the metadata service issued %d tokens for %d requests, want 1 token for every request (at least 3)", imds.Issued(), imds.Served())
	}
	if regs := w.registrations(); len(regs) != 1 || regs[0].UID != war.UID {
		t.Errorf("%d registrations, want the first one only", len(regs))
	}
}

// startAzureAgent configures the endpoint to trust ms for vm's tenant with
// a policy allowing vm's resource group, starts it, and runs the agent
// (platform azure, imds) until the test ends; renewFraction, when not 0, is
// the agent's RenewFraction (its SidecarRenewFraction is then 0.003). It
// returns the agent's logs.
func startAzureAgent(t *testing.T, w *world, ms *azuretest.Microsoft, imds *azuretest.IMDS, vm azuretest.VM, renewFraction float64) *vmsim.SyncBuffer {
	t.Helper()
	ctx := t.Context()
	const resource = "api://embark-onboarding"

	msCA := filepath.Join(w.dir, "microsoft-ca.pem")
	must(t, os.WriteFile(msCA, ms.CACertificates(), 0o600))
	cfg, err := os.ReadFile(w.cfgFile)
	must(t, err)
	must(t, os.WriteFile(w.cfgFile, []byte(strings.Replace(string(cfg), "identity:\n",
		fmt.Sprintf("identity:\n  azure:\n    tenants: [%s]\n    audiences: [%s]\n    jwksURL: %s\n    caFile: %s\n", vm.TenantID, resource, ms.JWKSURL(), msCA), 1)), 0o600))
	policy := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "azure", Namespace: w.ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{Azure: &authorizationv1alpha1.AzureMatcher{
				Tenants: []string{vm.TenantID}, Subscriptions: []string{vm.SubscriptionID}, ResourceGroups: []string{vm.ResourceGroup},
			}}},
			AddressCIDRs: []authorizationv1alpha1.CIDR{"10.1.0.0/24"},
			OnboardTo:    []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}
	must(t, env.Client.Create(ctx, policy))
	w.startEndpoint()

	root := t.TempDir()
	agentFile, onboardingFile := w.agentConfig(root)
	agentText, err := os.ReadFile(agentFile)
	must(t, err)
	must(t, os.WriteFile(agentFile, []byte(strings.Replace(string(agentText), "host:\n  aws:\n",
		fmt.Sprintf("host:\n  platform: azure\n  azure:\n    imdsEndpoint: %s\n    resource: %s\n  aws:\n", imds.URL(), resource), 1)), 0o600))
	agentCfg, err := config.LoadAgent(agentFile)
	must(t, err)
	onbCfg, err := config.LoadOnboarding(onboardingFile)
	must(t, err)
	logs := &vmsim.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	})
	log := slog.New(slog.NewTextHandler(logs, nil))
	plat, err := platform.Detect(ctx, agentCfg.Host, onbCfg.Audience(), log)
	must(t, err)
	opts := agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: "v0.0.0-test", Logger: log,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	if renewFraction != 0 {
		opts.RenewFraction, opts.SidecarRenewFraction = renewFraction, 0.003
	}
	a, err := agent.New(opts)
	must(t, err)
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() { stop(); <-done })
	return logs
}
