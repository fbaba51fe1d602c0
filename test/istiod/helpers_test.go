package istiod

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
)

// servingCert writes a CA and a serving certificate for 127.0.0.1 in dir.
func servingCert(t *testing.T, dir string) (certFile, keyFile, rootFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "embark test root"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "onboarding-endpoint"},
		DNSNames: []string{"onboarding-endpoint.example.corp"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, rootFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{certFile, "CERTIFICATE", der}, {keyFile, "PRIVATE KEY", keyDER}, {rootFile, "CERTIFICATE", caDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, rootFile
}

// workload is a registered VM.
type workload struct {
	key    client.ObjectKey
	ip     string
	token  string
	nodeID string
	entry  *istionetworkingv1.WorkloadEntry
}

// register registers VM n of wg through the registry, as the onboarding
// endpoint does.
func register(t *testing.T, wg *istionetworkingv1.WorkloadGroup, n int) *workload {
	t.Helper()
	ctx := t.Context()
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) }, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ip := fmt.Sprintf("10.0.0.%d", n)
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity(fmt.Sprintf("i-%017x", n)), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &workload{key: key, ip: ip, token: res.SidecarToken.Token, entry: res.WorkloadEntry,
		nodeID: fixtures.NodeID(ip, key)}
}

// stream is an ADS stream of a workload's sidecar to Embark.
type stream struct {
	st     *adsclient.SotW
	cancel func()
}

// connect opens the workload's ADS stream to the endpoint over TLS, as
// pilot-agent does, and waits for the first response.
func (w *workload) connect(t *testing.T, e *endpoint) *stream {
	t.Helper()
	roots := x509.NewCertPool()
	pemData, err := os.ReadFile(e.rootFile)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(pemData)
	conn, err := adsclient.Dial(e.xds, adsclient.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: w.nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{}),
	}}}
	st, err := adsclient.OpenSotW(context.WithoutCancel(t.Context()), conn, w.token, node)
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	s := &stream{st: st, cancel: func() { st.Close(); _ = conn.Close() }}
	t.Cleanup(s.cancel)
	if err := st.Request(resource.ListenerType); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Next(); err != nil {
		t.Fatalf("stream of %s: %v", w.key.Name, err)
	}
	go func() { _ = st.Wait() }() // drain pushes
	return s
}

// healthType is the type URL of pilot-agent's health reports.
const healthType = "type.googleapis.com/istio.v1.HealthInformation"

// reportHealth sends a health report as pilot-agent's health checker does.
func (s *stream) reportHealth(t *testing.T, healthy bool) {
	t.Helper()
	req := &discovery.DiscoveryRequest{TypeUrl: healthType}
	if !healthy {
		req.ErrorDetail = &status.Status{Code: 13, Message: "probe failed: connection refused"}
	}
	if err := s.st.Send(req); err != nil {
		t.Fatal(err)
	}
}

// csrPEM is a PEM certificate request with a fresh key.
func csrPEM(t *testing.T) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "vm"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}
