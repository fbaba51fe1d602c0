package integration

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	demovm "github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
)

// An Azure VM onboards with its managed identity token: the real agent
// (platform azure) fetches a token for the endpoint's resource
// (api://embark-onboarding) from a loopback Instance Metadata Service, the
// real endpoint verifies it against a loopback Entra ID key endpoint
// (identity.azure.jwksURL) for the allowed tenant and the policy's azure
// rule allows it; its address is allowed by the rule's addressCIDRs, as the
// token proves none. kubectl describe war shows the Azure identity.
func TestAzureVMOnboards(t *testing.T) {
	w, vm, imds := newAzureWorld(t, false)
	runAzureAgent(w, imds, agentRun{})
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
	w, _, imds := newAzureWorld(t, true)
	// 1m onboarding tokens renewed after 6s; 1h sidecar tokens after ~11s.
	logs := runAzureAgent(w, imds, agentRun{renewFraction: 0.1, sidecarRenewFraction: 0.003}).logs

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

// The agent process ends without unregistering (it crashed, or the VM
// lost its network and was rebooted) while Azure's metadata service still
// hands out the token it onboarded with. The agent started again finds its
// session in its state directory and presents the cached token with its
// onboarding token and session key: it is onboarded again at once, with
// the same registration, without waiting for a new token.
func TestAzureVMAgentRestartKeepsItsSession(t *testing.T) {
	w, _, imds := newAzureWorld(t, true)
	state := filepath.Join(t.TempDir(), "state")

	link := &cuttableNetwork{}
	first := runAzureAgent(w, imds, agentRun{agentFiles: agentFiles{stateDir: state}, dialOptions: []grpc.DialOption{grpc.WithContextDialer(link.dial)}})
	fixtures.Eventually(t, 60*time.Second, "the Azure VM registered", func() bool {
		return len(w.registrations()) == 1 && strings.Contains(first.logs.String(), "onboarded: sidecar bootstrap written")
	})
	war := w.registrations()[0]
	if fi, err := os.Stat(filepath.Join(state, agent.SessionFileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the agent kept no session file of mode 0600: %v, %v", fi, err)
	}
	// The process ends unable to unregister.
	link.cut()
	_ = first.stop()
	if !strings.Contains(first.logs.String(), "unregister failed") {
		t.Fatalf("the first agent did not fail to unregister:\n%s", first.logs.String())
	}
	if regs := w.registrations(); len(regs) != 1 || regs[0].UID != war.UID {
		t.Fatalf("%d registrations after the agent ended, want the first one", len(regs))
	}

	second := runAzureAgent(w, imds, agentRun{agentFiles: agentFiles{stateDir: state}})
	fixtures.Eventually(t, 20*time.Second, "the restarted agent onboarded", func() bool {
		return strings.Contains(second.logs.String(), "onboarded: sidecar bootstrap written")
	})
	l := second.logs.String()
	if !strings.Contains(l, "restored the agent session kept across restarts") {
		t.Errorf("the restarted agent did not restore its session:\n%s", l)
	}
	if strings.Contains(l, "Replayed") {
		t.Errorf("the restarted agent was refused as a replay:\n%s", l)
	}
	if imds.Issued() != 1 {
		t.Errorf("the metadata service issued %d tokens, want the one it cached", imds.Issued())
	}
	if regs := w.registrations(); len(regs) != 1 || regs[0].UID != war.UID {
		t.Errorf("registrations %d (first UID %s), want the first one (UID %s) only", len(regs), regs[0].UID, war.UID)
	}
}

// The VM's registration is deleted (kubectl delete war) while Azure's
// metadata service still hands out the token the agent onboarded with: the
// agent onboards again within seconds with that token, its onboarding
// token (bound to its session) and its session key; a new registration.
func TestAzureVMReonboardsWithCachedTokenAfterDeletion(t *testing.T) {
	w, _, imds := newAzureWorld(t, true)
	a := runAzureAgent(w, imds, agentRun{})
	fixtures.Eventually(t, 60*time.Second, "the Azure VM registered", func() bool {
		return len(w.registrations()) == 1 && strings.Contains(a.logs.String(), "onboarded: sidecar bootstrap written")
	})
	war := w.registrations()[0]

	must(t, env.Client.Delete(t.Context(), &war))
	fixtures.Eventually(t, 20*time.Second, "a new registration", func() bool {
		regs := w.registrations()
		return len(regs) == 1 && regs[0].UID != war.UID && strings.Count(a.logs.String(), "onboarded: sidecar bootstrap written") == 2
	})
	l := a.logs.String()
	if !strings.Contains(l, "registration gone") {
		t.Errorf("the agent did not notice the deletion:\n%s", l)
	}
	if strings.Contains(l, "Replayed") {
		t.Errorf("onboarding again was refused as a replay:\n%s", l)
	}
	if imds.Issued() != 1 || imds.Served() < 2 {
		t.Errorf("the metadata service issued %d tokens for %d requests, want its one cached token for every request (at least 2)", imds.Issued(), imds.Served())
	}
}

// cuttableNetwork dials the endpoint until cut, which closes every
// connection it made and refuses new ones: the agent can no longer reach
// the endpoint.
type cuttableNetwork struct {
	mu    sync.Mutex
	off   bool
	conns []net.Conn
}

func (n *cuttableNetwork) dial(ctx context.Context, addr string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.off {
		return nil, errors.New("network cut")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

func (n *cuttableNetwork) cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.off = true
	for _, c := range n.conns {
		_ = c.Close()
	}
}

// newAzureWorld returns a world with a loopback Entra ID that the endpoint
// trusts for the default VM's tenant, a policy allowing the VM's resource
// group, the endpoint started, and the VM's metadata service (caching: it
// hands out the token it issued first again, as Azure's does).
func newAzureWorld(t *testing.T, caching bool) (*world, azuretest.VM, *azuretest.IMDS) {
	t.Helper()
	w := newWorld(t)
	ms, err := azuretest.NewMicrosoft()
	must(t, err)
	t.Cleanup(ms.Close)
	vm := azuretest.DefaultVM()
	newIMDS := azuretest.NewIMDS
	if caching {
		newIMDS = azuretest.NewCachingIMDS
	}
	imds := newIMDS(ms, vm)
	t.Cleanup(imds.Close)
	configureAzure(t, w, ms, vm)
	return w, vm, imds
}

// configureAzure configures the endpoint to trust ms for vm's tenant with
// a policy allowing vm's resource group, and starts it.
func configureAzure(t *testing.T, w *world, ms *azuretest.Microsoft, vm azuretest.VM) {
	t.Helper()
	ctx := t.Context()
	msCA := filepath.Join(w.dir, "microsoft-ca.pem")
	must(t, os.WriteFile(msCA, ms.CACertificates(), 0o600))
	w.cfg.Identity.Azure = &endpointconfig.AzureIdentity{Tenants: []string{vm.TenantID}, Audiences: []string{azureResource}, JWKSURL: ms.JWKSURL(), CAFile: msCA}
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
}

// azureResource is the resource the agents ask IMDS for a token for, the
// endpoint's audience.
const azureResource = "api://embark-onboarding"

// runAzureAgent runs an agent (platform azure, imds) with o until stop or
// the end of the test.
func runAzureAgent(w *world, imds *azuretest.IMDS, o agentRun) *runningAgent {
	w.t.Helper()
	o.platform = demovm.AzureHost(imds.URL(), azureResource)
	return w.runAgent(o)
}
