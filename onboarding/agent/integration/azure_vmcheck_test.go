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
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	demovm "github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
)

// An Azure VM onboards where the endpoint confirms VMs with Azure Resource
// Manager (identity.azure.vmCheck against a loopback Resource Manager, the
// endpoint's own token from a loopback IMDS): the policy's azure rule names
// the VM's location and lists no addressCIDRs, so the VM is admitted only
// because Resource Manager reports it in westeurope, and its address only
// because it is its primary network interface's private address. The
// WorkloadEntry has that address and the location as its locality; kubectl
// describe war shows the location and VM ID.
func TestAzureVMConfirmedByResourceManagerOnboards(t *testing.T) {
	w := newWorld(t)
	ms, err := azuretest.NewMicrosoft()
	must(t, err)
	t.Cleanup(ms.Close)
	vm := azuretest.DefaultVM()
	imds := azuretest.NewIMDS(ms, vm)
	t.Cleanup(imds.Close)
	arm := azuretest.NewARM()
	t.Cleanup(arm.Close)
	arm.AddVM(vm)
	startConfirmedAzureAgent(t, w, ms, imds, arm, vm)
	ctx := t.Context()

	fixtures.Eventually(t, 60*time.Second, "the Azure VM registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	if id := war.Spec.Identity.Azure; id == nil || !id.VMConfirmed || id.Location != vm.Location || id.VMID != vm.VMID || id.PrincipalID != vm.PrincipalID {
		t.Fatalf("registration identity %+v, want the VM confirmed in %s with VM ID %s", id, vm.Location, vm.VMID)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	fixtures.Eventually(t, 30*time.Second, "the WorkloadEntry", func() bool {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: war.Name}, we) == nil
	})
	if we.Spec.Address != vm.IP || we.Spec.Locality != vm.Location {
		t.Errorf("WorkloadEntry address %s, locality %q; want the network interface's private address %s and locality %s", we.Spec.Address, we.Spec.Locality, vm.IP, vm.Location)
	}
	if arm.Calls() < 2 || arm.TokensIssued() == 0 {
		t.Errorf("Resource Manager: %d calls with %d tokens of the endpoint, want the VM and its network interface read", arm.Calls(), arm.TokensIssued())
	}

	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", w.ns, war.Name)
	must(t, err)
	for _, f := range [][2]string{{"Location", vm.Location}, {"Vm Id", vm.VMID}, {"Vm Confirmed", "true"}, {"Vm Name", vm.Name}} {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(f[0]) + `:\s+` + regexp.QuoteMeta(f[1]) + `$`).MatchString(desc) {
			t.Errorf("kubectl describe war lacks %q: %q:\n%s", f[0], f[1], desc)
		}
	}
}

// startConfirmedAzureAgent configures the endpoint to trust ms for vm's
// tenant and confirm VMs with arm, with a policy allowing vm's subscription
// in vm's location (no addressCIDRs), starts it, and runs the agent
// (platform azure, imds) until the test ends.
func startConfirmedAzureAgent(t *testing.T, w *world, ms *azuretest.Microsoft, imds *azuretest.IMDS, arm *azuretest.ARM, vm azuretest.VM) {
	t.Helper()
	ctx := t.Context()
	const resource = "api://embark-onboarding"

	msCA := filepath.Join(w.dir, "microsoft-ca.pem")
	must(t, os.WriteFile(msCA, ms.CACertificates(), 0o600))
	w.cfg.Identity.Azure = &endpointconfig.AzureIdentity{Tenants: []string{vm.TenantID}, Audiences: []string{resource}, JWKSURL: ms.JWKSURL(), CAFile: msCA,
		VMCheck: &endpointconfig.AzureVMCheck{ARMEndpoint: arm.URL(), IMDSEndpoint: arm.URL()}}
	policy := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "azure", Namespace: w.ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{Azure: &authorizationv1alpha1.AzureMatcher{
				Tenants: []string{vm.TenantID}, Subscriptions: []string{vm.SubscriptionID}, Locations: []string{vm.Location},
			}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}
	must(t, env.Client.Create(ctx, policy))
	w.startEndpoint()

	w.runAgent(agentRun{agentFiles: agentFiles{platform: demovm.AzureHost(imds.URL(), resource)}})
}
