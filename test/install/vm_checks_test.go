//go:build install

package install

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
)

// checkWorkloadCertificate waits for the certificate pilot-agent writes in
// vm (OUTPUT_CERTS: /etc/certs, istio-start.sh's default) and checks it
// chains to istiodRoot and names the SPIFFE ID want.
func checkWorkloadCertificate(t *testing.T, vm *VM, istiodRoot []byte, want string) {
	t.Helper()
	var chain string
	fixtures.Eventually(t, 60*time.Second, "the workload certificate in /etc/certs/cert-chain.pem", func() bool {
		s, err := vm.ReadFile("/etc/certs/cert-chain.pem")
		chain = s
		return err == nil && strings.Contains(s, "BEGIN CERTIFICATE")
	})
	block, rest := pem.Decode([]byte(chain))
	leaf, err := x509.ParseCertificate(block.Bytes)
	must(t, err)
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AppendCertsFromPEM(istiodRoot)
	inter.AppendCertsFromPEM(rest)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("the workload certificate does not chain to istiod's root: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("the workload certificate names %v, want %s", leaf.URIs, want)
	}
}

// checkProxyStatus waits until `istioctl proxy-status` against istiod's
// plaintext xDS address lists want (proxy -> istiod column) with each of
// types SYNCED.
func checkProxyStatus(t *testing.T, istiodAddr string, want map[string]string, types ...string) {
	t.Helper()
	var last string
	err := fixtures.Poll(t.Context(), time.Second, 60*time.Second, func() error {
		out, err := istioagent.Istioctl(t.Context(), t, "proxy-status", "--xds-address", istiodAddr, "--plaintext", "-r", "default", "-v", "1")
		if err != nil {
			return err
		}
		last = out
		if err := check.ProxyStatus(out, want); err != nil {
			return err
		}
		return check.Synced(out, len(want), types...)
	})
	if err != nil {
		t.Errorf("istioctl proxy-status: %v\n%s", err, last)
	}
}

// waitRegistration waits for the one registration in the operator guide's
// namespace and checks it carries the VM's address on n.
func waitRegistration(t *testing.T, c *Cluster, n *Network) runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	var reg runtimev1alpha1.WorkloadAutoRegistration
	fixtures.Eventually(t, 60*time.Second, "a WorkloadAutoRegistration", func() bool {
		l := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		if c.Kube.List(t.Context(), l, client.InNamespace(guideNamespace)) != nil || len(l.Items) != 1 {
			return false
		}
		reg = l.Items[0]
		return true
	})
	if a := reg.Spec.Registration.Host.Addresses; len(a) == 0 || a[0].IP != n.PeerIP.String() {
		t.Errorf("registered addresses %+v, want %s", a, n.PeerIP)
	}
	return reg
}

// waitBootstrapInstalled waits until onboarding-agent-sidecar.path has
// installed reg's cluster.env where istio.service reads it and
// istio.service is active.
func waitBootstrapInstalled(t *testing.T, vm *VM, reg runtimev1alpha1.WorkloadAutoRegistration) {
	t.Helper()
	fixtures.Eventually(t, 60*time.Second, "cluster.env installed", func() bool {
		s, err := vm.ReadFile("/var/lib/istio/envoy/cluster.env")
		return err == nil && strings.Contains(s, "POD_NAME='"+reg.Name+"'")
	})
	fixtures.Eventually(t, 60*time.Second, "istio.service active", func() bool {
		_, err := vm.Run(t.Context(), "systemctl is-active --quiet istio", nil)
		return err == nil
	})
}

// checkSidecarConnected plays Envoy on the VM's sidecar, then checks its
// workload certificate from istiod's CA (the group's SPIFFE ID) and waits
// for reg's AgentConnected=True.
func checkSidecarConnected(t *testing.T, c *Cluster, vm *VM, reg runtimev1alpha1.WorkloadAutoRegistration) {
	t.Helper()
	vm.StartEnvoyStandIn(t)
	checkWorkloadCertificate(t, vm, c.Istiod.RootCert, "spiffe://"+c.Istiod.TrustDomain+"/ns/"+guideNamespace+"/sa/"+fixtures.ServiceAccount)
	fixtures.Eventually(t, 90*time.Second, "AgentConnected=True", func() bool {
		r := &runtimev1alpha1.WorkloadAutoRegistration{}
		if c.Kube.Get(t.Context(), client.ObjectKey{Namespace: guideNamespace, Name: reg.Name}, r) != nil {
			return false
		}
		return meta.IsStatusConditionTrue(r.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	})
}
