//go:build install

package install

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

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
