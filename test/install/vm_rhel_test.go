//go:build install

package install

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

// TestRHELVMFollowsTheGuide is TestInstallAsAUserDoes for the RHEL family:
// the same release (README.md's values, the image), and a VM running
// docs/vm-install.md's RHEL blocks as written: the repository key pinned,
// /etc/yum.repos.d/embark.repo with gpgcheck and repo_gpgcheck, and `dnf
// install -y istio-sidecar onboarding-agent` from the endpoint's signed yum
// repository through the gateway's 443. The istio-sidecar RPM is the test's
// build (BuildIstioSidecarRPM), signed with the repository key as
// docs/local-repository.md asks of an operator. The simulated VM is the
// host's Debian root with dnf and rpm (there is no RHEL root here): dnf,
// rpm and the packages' scripts are real, the rpm database is the VM's own.
// It ends with both packages installed by rpm with the repository key's
// signature (and not by dpkg), the registration AgentConnected=True, the
// certificate chaining to istiod's root, and the VM SYNCED at istiod.
func TestRHELVMFollowsTheGuide(t *testing.T) {
	key := os.Getenv("PACKAGE_SIGNING_KEY")
	if key == "" {
		needed(t, "PACKAGE_SIGNING_KEY names no key: the istio-sidecar RPM is signed with the repository key (make install-test sets it)")
	}
	vmNet := NewNetwork(t, "embark-vm", "10.201.0.1/30", "10.201.0.2/30", false)
	aws := awstest.Start(t, awstest.Instance{PrivateIP: vmNet.PeerIP.String()})
	ServeIMDS(t, vmNet, aws.IMDS.URL)
	c := StartCluster(t, ClusterOptions{ValuesFromREADME: true, GatewayIP: vmNet.HostIP,
		ExtraValues: []string{simulatedWorldValues(t, aws, worldOptions{RPMSigningKey: key})}})
	vm := StartVM(t, vmNet, map[string]netip.Addr{c.Host: c.GatewayIP})
	ctx := t.Context()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := vm.Run(context.WithoutCancel(ctx), "journalctl; tail -n 40 /var/log/istio/istio.log /var/log/istio/istio.err.log || true", nil)
			t.Logf("the VM's journal (stand-in) and Istio's log:\n%s\nthe endpoint's log:\n%s", out, c.Log())
		}
	})

	t.Log("docs/vm-install.md's RHEL blocks, as written, with the CA and keys the operator has")
	FollowRHELGuide(t, vm, c.Host, c.ServingCA, c.RepositoryKeyFingerprints)
	checkRPMSignatures(t, vm, c.RepositoryKeyFingerprints, "istio-sidecar", "onboarding-agent")

	t.Log("onboarded: one registration with the VM's EC2 address, the bootstrap installed, istio.service started")
	reg := waitRegistration(t, c, vmNet)
	waitBootstrapInstalled(t, vm, reg)

	t.Log("the sidecar: its certificate from istiod's CA, AgentConnected=True, SYNCED at istiod")
	checkSidecarConnected(t, c, vm, reg)
	checkProxyStatus(t, c.IstiodAddr, map[string]string{reg.Name + "." + guideNamespace: "istiod-local"}, "CDS", "LDS")
}

// checkRPMSignatures checks that each of pkgs is installed in vm's rpm
// database with an RSA/SHA256 signature of one of the keys fingerprints
// (rpm names a key by the last 16 hex digits of its fingerprint), and that
// dpkg did not install it.
func checkRPMSignatures(t *testing.T, vm *VM, fingerprints []string, pkgs ...string) {
	t.Helper()
	for _, pkg := range pkgs {
		out, err := vm.Run(t.Context(), "rpm -q --queryformat '%{NAME} %{SIGPGP:pgpsig}' "+pkg, nil)
		if err != nil {
			t.Errorf("rpm -q %s: %v\n%s", pkg, err, out)
			continue
		}
		signed := false
		for _, fp := range fingerprints {
			if len(fp) == 40 && strings.Contains(out, "RSA/SHA256") && strings.Contains(strings.ToLower(out), "key id "+strings.ToLower(fp[24:])) {
				signed = true
			}
		}
		if !signed {
			t.Errorf("rpm -q %s: %q, want an RSA/SHA256 signature of one of %v", pkg, out, fingerprints)
		}
		if got, err := vm.Run(t.Context(), "dpkg-query -W -f '${Status}' "+pkg, nil); err == nil && strings.Contains(got, "installed") {
			t.Errorf("dpkg has %s installed (%q): the guide's RHEL blocks install with dnf", pkg, got)
		}
	}
}
