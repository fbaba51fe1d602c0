package xds

import (
	"crypto/x509"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/testenv"
)

// Every pilot-agent these tests run gets a real workload certificate from a
// real istiod's CA with the token registration issued, as on a VM. Here it
// asks istiod's CA directly (CA_ADDR): Embark's certificate relay (xds/ca)
// imports this package, so its tests cannot run it; test/istiod and the demo
// run pilot-agent through the relay. The tests that need istiod for nothing
// else share one, started on first use.

// certClusterID is the shared istiod's cluster ID.
const certClusterID = "vm-cluster"

var (
	certIstiodOnce sync.Once
	certIstiod     *testenv.Istiod
	certIstiodErr  error
)

// sharedIstiod returns the package's istiod for certificates.
func sharedIstiod(t *testing.T) *testenv.Istiod {
	t.Helper()
	certIstiodOnce.Do(func() {
		// Its cluster ID is the one these tests' sidecars name
		// (ISTIO_META_CLUSTER_ID, sent as the ClusterID header): istiod
		// authenticates a caller of another cluster against that cluster's
		// API server, and refuses it when it knows none.
		certIstiod, certIstiodErr = testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{Env: []string{"CLUSTER_ID=" + certClusterID}})
	})
	if certIstiodErr != nil {
		t.Fatalf("istiod: %v", certIstiodErr)
	}
	return certIstiod
}

// stopSharedIstiod stops the shared istiod, if one started (TestMain).
func stopSharedIstiod() {
	if certIstiod != nil {
		_ = certIstiod.Close()
	}
}

// withIstiodCA sets opts to get pilot-agent's certificate from i's CA.
func withIstiodCA(i *testenv.Istiod, opts istioagent.Options) istioagent.Options {
	opts.CAAddress, opts.CARootCA = i.SecureGRPCAddr, i.RootCert
	return opts
}

// checkCertificate waits for the agent's workload certificate and checks
// that istiod's CA signed it for the workload's service account.
func checkCertificate(t *testing.T, agent *istioagent.Agent, i *testenv.Istiod, ns, sa string) {
	t.Helper()
	chainPEM, rootPEM, err := agent.WaitCertificates(60 * time.Second)
	if err != nil {
		t.Fatalf("%v\npilot-agent log:\n%s", err, tail(agent.Logs(), 40))
	}
	var chain []*x509.Certificate
	for b, rest := pem.Decode(chainPEM); b != nil; b, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		t.Fatal("empty certificate chain")
	}
	want := "spiffe://cluster.local/ns/" + ns + "/sa/" + sa
	if u := chain[0].URIs; len(u) != 1 || u[0].String() != want {
		t.Errorf("workload certificate URI SANs %v, want %s", u, want)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: i.RootPool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("workload certificate does not chain to istiod's root: %v", err)
	}
	if string(rootPEM) == "" {
		t.Error("no ROOTCA")
	}
}
