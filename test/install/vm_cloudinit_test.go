//go:build install

package install

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

// TestCloudInitExamples runs each user-data example of
// docs/examples/cloud-init in a fresh VM as cloud-init would (write_files,
// then runcmd with sh; CloudConfig says which subset), filled in as its
// comments tell an operator to, against one release installed as the
// README says (StartCluster: the chart's objects, the endpoint from the
// image), and checks that the VM onboards, its sidecar gets its
// certificate from istiod and connects, and the agent unregisters when
// stopped: the EC2 Auto Scaling example with the instance's identity (IMDS
// at 169.254.169.254 in the VM) under docs/operator-guide.md's policy, the
// on-prem one with a JWT its credential plugin prints, of the issuer and
// under the policy docs/identity.md's "On-prem set-up" configures (the
// kube-apiserver's service-account issuer, found by OIDC discovery from
// the endpoint's Pod, its CA mounted with extraVolumes).
func TestCloudInitExamples(t *testing.T) {
	vmNet := NewNetwork(t, "embark-vm", "10.201.0.1/30", "10.201.0.2/30", false)
	aws := awstest.Start(t, awstest.Instance{PrivateIP: vmNet.PeerIP.String()})
	ServeIMDS(t, vmNet, aws.IMDS.URL)
	onprem := &onPremIssuer{audience: readmeHost(t)}
	c := StartCluster(t, ClusterOptions{ValuesFromREADME: true, GatewayIP: vmNet.HostIP, Values: func(t *testing.T, env *testenv.Env) []string {
		return onprem.setUp(t, env, func(m ...hostMount) string { return simulatedWorldValues(t, aws, worldOptions{Mounts: m}) })
	}})
	if c.Host != onprem.audience {
		t.Fatalf("the endpoint's host %q is not README.md's hosts[0] %q", c.Host, onprem.audience)
	}
	onprem.allow(t, c, vmNet.PeerIP.String()+"/32")
	regs := func(ctx context.Context) []runtimev1alpha1.WorkloadAutoRegistration {
		l := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		must(t, c.Kube.List(ctx, l, client.InNamespace(guideNamespace)))
		return l.Items
	}
	spiffeID := "spiffe://" + c.Istiod.TrustDomain + "/ns/" + guideNamespace + "/sa/" + fixtures.ServiceAccount
	for _, tc := range []struct {
		file string
		// setup does what the operator's own tooling does on the host.
		setup func(t *testing.T, vm *VM)
		// onboarded reports whether r is this host's registration.
		onboarded func(r runtimev1alpha1.WorkloadAutoRegistration) bool
	}{
		{
			file:  "ec2-autoscaling.yaml",
			setup: func(*testing.T, *VM) {},
			onboarded: func(r runtimev1alpha1.WorkloadAutoRegistration) bool {
				return r.Spec.Identity.AWS != nil && r.Spec.Identity.AWS.EC2 != nil
			},
		},
		{
			file:  "onprem.yaml",
			setup: onprem.plugin,
			onboarded: func(r runtimev1alpha1.WorkloadAutoRegistration) bool {
				return r.Spec.Identity.JWT != nil && r.Spec.Identity.JWT.Subject == onPremSubject
			},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			ctx := t.Context()
			data, err := os.ReadFile(filepath.Join("../../docs/examples/cloud-init", tc.file))
			must(t, err)
			cc, err := ParseCloudConfig(data)
			must(t, err)
			values := map[string]string{
				cloudInitHost: c.Host,
				cloudInitKeys: strings.Join(c.RepositoryKeyFingerprints, " "),
				cloudInitCA:   strings.TrimSpace(string(c.ServingCA)),
			}
			if tc.file == "onprem.yaml" {
				values[cloudInitJWTCommand] = cloudInitJWTCommand // the test installs its stand-in there
			}
			must(t, cc.Fill(values))
			vm := StartVM(t, vmNet, map[string]netip.Addr{c.Host: c.GatewayIP})
			t.Cleanup(func() {
				if t.Failed() {
					out, _ := vm.Run(context.WithoutCancel(ctx), "journalctl", nil)
					t.Logf("the VM's journal (stand-in):\n%s\nthe endpoint's log:\n%s", out, c.Log())
				}
			})
			tc.setup(t, vm)
			out, err := vm.Run(ctx, `exec sh -c "$USER_DATA"`, map[string]string{"USER_DATA": cc.Script()})
			t.Logf("cloud-init (write_files, runcmd) in the VM:\n%s", out)
			if err != nil {
				t.Fatalf("user-data failed: %v", err)
			}
			var reg runtimev1alpha1.WorkloadAutoRegistration
			fixtures.Eventually(t, 60*time.Second, "the host registered", func() bool {
				for _, r := range regs(ctx) {
					if tc.onboarded(r) {
						reg = r
						return true
					}
				}
				return false
			})
			if a := reg.Spec.Registration.Host.Addresses; len(a) == 0 || a[0].IP != vmNet.PeerIP.String() {
				t.Errorf("registered addresses %+v, want %s", a, vmNet.PeerIP)
			}
			fixtures.Eventually(t, 60*time.Second, "the bootstrap installed by the .path unit", func() bool {
				s, err := vm.ReadFile("/var/lib/istio/envoy/cluster.env")
				return err == nil && strings.Contains(s, "POD_NAME='"+reg.Name+"'")
			})
			vm.StartEnvoyStandIn(t)
			checkWorkloadCertificate(t, vm, c.Istiod.RootCert, spiffeID)
			fixtures.Eventually(t, 90*time.Second, "AgentConnected=True", func() bool {
				r := &runtimev1alpha1.WorkloadAutoRegistration{}
				if c.Kube.Get(ctx, client.ObjectKey{Namespace: guideNamespace, Name: reg.Name}, r) != nil {
					return false
				}
				return meta.IsStatusConditionTrue(r.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
			})
			// Scaled in / decommissioned: the agent unregisters when stopped.
			if out, err := vm.Run(ctx, "systemctl stop onboarding-agent", nil); err != nil {
				t.Fatalf("systemctl stop onboarding-agent: %v\n%s", err, out)
			}
			fixtures.Eventually(t, 30*time.Second, "the registration removed", func() bool {
				for _, r := range regs(ctx) {
					if r.Name == reg.Name {
						return false
					}
				}
				return true
			})
		})
	}
}

// plugin installs, in the VM, a STAND-IN for the operator's credential
// plugin at the path onprem.yaml names: it prints the token the test
// refreshes every second in the VM's /run/embark-install-test/jwt (the VM
// cannot reach the issuer; a real plugin fetches its token from the
// operator's identity system), fresh as each authorization needs one.
func (o *onPremIssuer) plugin(t *testing.T, vm *VM) {
	t.Helper()
	must(t, vm.WriteFile(cloudInitJWTCommand, []byte("#!/bin/sh\n# STAND-IN (test/install) for the operator's credential plugin.\nexec cat /run/embark-install-test/jwt\n"), 0o755))
	write := func() {
		must(t, vm.WriteFile("/run/embark-install-test/jwt.tmp", []byte(o.mint(t.Context(), t)), 0o644))
		must(t, os.Rename(vm.Path("/run/embark-install-test/jwt.tmp"), vm.Path("/run/embark-install-test/jwt")))
	}
	write()
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				tr, err := o.mintErr(ctx)
				if err != nil {
					continue
				}
				if os.WriteFile(vm.Path("/run/embark-install-test/jwt.tmp"), []byte(tr), 0o644) == nil {
					_ = os.Rename(vm.Path("/run/embark-install-test/jwt.tmp"), vm.Path("/run/embark-install-test/jwt"))
				}
			}
		}
	}()
	t.Cleanup(func() { stop(); <-done })
}
