package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"strings"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/testenv"
)

// servingCert is the endpoint's demo TLS certificate and the CA that signed it.
type servingCert struct {
	certFile, keyFile string
	caFile            string // the CA's PEM, as the VMs trust it
	pool              *x509.CertPool
}

// writeServingCert writes the endpoint's serving certificate for host,
// signed by a demo CA, and the CA the VMs trust, into dir.
func writeServingCert(dir, host string) (servingCert, error) {
	ca, err := fixtures.NewCA("Embark demo CA")
	if err != nil {
		return servingCert{}, err
	}
	sc := servingCert{caFile: filepath.Join(dir, "demo-ca.pem"), pool: ca.Pool()}
	if sc.certFile, sc.keyFile, err = ca.ServingCert(dir, host); err != nil {
		return servingCert{}, err
	}
	return sc, ca.WritePEM(sc.caFile)
}

// checkCreated checks that the seeds are stored in namespace ns.
func checkCreated(ctx context.Context, env *testenv.Env, ns string) error {
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ratings"}, &istionetworkingv1.WorkloadGroup{}); err != nil {
		return fmt.Errorf("WorkloadGroup ratings: %w", err)
	}
	policies := &authorizationv1alpha1.OnboardingPolicyList{}
	if err := env.Client.List(ctx, policies); err != nil {
		return err
	}
	if len(policies.Items) != 1 {
		return fmt.Errorf("%d OnboardingPolicies, want 1", len(policies.Items))
	}
	return nil
}

func keyOf(v *vm.VM) types.NamespacedName {
	return types.NamespacedName{Namespace: "bookinfo", Name: v.Reg()}
}

// mustAssets is where `make testenv` put istioctl (for the hint printed at
// the end; the demo itself found it there already).
func mustAssets() string {
	dir, err := testenv.AssetsDir("")
	if err != nil {
		return "bin/testenv"
	}
	return dir
}

// freePort returns a port free on 127.0.0.1 a moment ago.
func freePort() (int, error) { return freeport.Port() }

func freeAddr() string {
	a, err := freeport.Addr()
	if err != nil {
		return "127.0.0.1:0"
	}
	return a
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
