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
	"os"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/meshkit"
)

// workload is a registered VM.
type workload struct{ *meshkit.VM }

// register registers VM n of wg through the registry, as the onboarding
// endpoint does; its address is 10.0.0.n.
func register(t *testing.T, wg *istionetworkingv1.WorkloadGroup, n int) *workload {
	t.Helper()
	return &workload{meshkit.Register(t, env, wg, n, fmt.Sprintf("10.0.0.%d", n))}
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
	node := &core.Node{Id: w.NodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{}),
	}}}
	st, err := adsclient.OpenSotW(context.WithoutCancel(t.Context()), conn, w.Token, node)
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
		t.Fatalf("stream of %s: %v", w.Key.Name, err)
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
