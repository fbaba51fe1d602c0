// Package istiodview shows what istiod serves, as the demo checks it: the
// endpoints of a Service as a pod's proxy receives them over EDS
// (PodProxy), and the workload certificates its CA issued to the VMs'
// sidecars (WorkloadCert).
package istiodview

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/test/adsclient"
)

// The productpage pod whose proxy PodProxy is: its name and address on the
// pods' network.
const (
	ProductpagePodName = "productpage-v1-5d9c8b7f6-x2v4k"
	ProductpagePodIP   = "10.244.0.9"
)

// PodProxy is the proxy of a pod of another workload (productpage) as
// istiod sees it: an ADS stream to istiod with a pod's node ID, subscribed
// to the endpoints (EDS) of one cluster. It uses istiod's plaintext port,
// which authenticates nobody (tests and demos only); istiod serves it what
// it serves a pod.
type PodProxy struct {
	NodeID  string
	Cluster string
	conn    *grpc.ClientConn
	cancel  context.CancelFunc

	mu   sync.Mutex
	last *endpointv3.ClusterLoadAssignment
	err  error
}

// StartPodProxy connects productpage's proxy to istiod's plaintext xDS
// address, subscribed to the endpoints of cluster. Its node metadata names
// network as the sidecar injector does (ISTIO_META_NETWORK, from the
// topology.istio.io/network label of istiod's namespace): istiod sends it
// the endpoints of other networks through their gateways. The stream
// outlives ctx; Close ends it.
func StartPodProxy(ctx context.Context, addr, network, cluster string) (*PodProxy, error) {
	conn, err := adsclient.Dial(addr)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &PodProxy{
		NodeID:  nodeid.Build(ProductpagePodIP, types.NamespacedName{Namespace: "bookinfo", Name: ProductpagePodName}),
		Cluster: cluster,
		conn:    conn, cancel: cancel,
	}
	node := &core.Node{Id: p.NodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"CLUSTER_ID":    structpb.NewStringValue("Kubernetes"),
		"NETWORK":       structpb.NewStringValue(network),
		"NAMESPACE":     structpb.NewStringValue("bookinfo"),
		"ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
		"LABELS":        structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"app": structpb.NewStringValue("productpage")}}),
	}}}
	st, err := adsclient.OpenSotW(pctx, conn, "", node)
	if err != nil {
		p.Close()
		return nil, err
	}
	if err := st.Request(resource.EndpointType, p.Cluster); err != nil {
		p.Close()
		return nil, err
	}
	go p.run(st)
	return p, nil
}

func (p *PodProxy) run(st *adsclient.SotW) {
	for {
		resp, err := st.Next()
		if err == nil {
			err = st.ACK(resp)
		}
		if err != nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			return
		}
		for _, r := range resp.GetResources() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if r.UnmarshalTo(cla) == nil && cla.GetClusterName() == p.Cluster {
				p.mu.Lock()
				p.last = cla
				p.mu.Unlock()
			}
		}
	}
}

// Close ends the stream.
func (p *PodProxy) Close() {
	p.cancel()
	_ = p.conn.Close()
}

// Endpoint is one endpoint of the cluster as istiod serves it to the pod.
type Endpoint struct {
	Address, Health, Locality string
}

// Endpoints returns the latest endpoints istiod served, by IP.
func (p *PodProxy) Endpoints() (map[string]Endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, fmt.Errorf("istiod closed productpage's stream: %w", p.err)
	}
	if p.last == nil {
		return nil, fmt.Errorf("istiod has sent no endpoints of %s yet", p.Cluster)
	}
	out := map[string]Endpoint{}
	for _, le := range p.last.GetEndpoints() {
		loc := le.GetLocality()
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addr := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
			out[sa.GetAddress()] = Endpoint{Address: addr, Health: lb.GetHealthStatus().String(), Locality: loc.GetRegion() + "/" + loc.GetZone()}
		}
	}
	return out, nil
}

// Routable reports whether a pod's Envoy sends traffic to e.
func (e Endpoint) Routable() bool {
	return e.Health == core.HealthStatus_HEALTHY.String() || e.Health == core.HealthStatus_UNKNOWN.String()
}

// WorkloadCert reads the certificate pilot-agent wrote in dir and checks
// it: one URI SAN, want; chains to roots, istiod's; root-cert.pem is
// istiod's root (rootPEM).
func WorkloadCert(dir, want string, roots *x509.CertPool, rootPEM []byte) (*x509.Certificate, error) {
	chainPEM, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
	if err != nil {
		return nil, fmt.Errorf("no workload certificate yet: %w", err)
	}
	chain, err := parseCerts(chainPEM)
	if err != nil || len(chain) == 0 {
		return nil, fmt.Errorf("cert-chain.pem: no certificate (%v)", err)
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		return nil, fmt.Errorf("workload certificate URI SANs %v, want [%s]", leaf.URIs, want)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("workload certificate does not chain to istiod's root: %w", err)
	}
	written, err := os.ReadFile(filepath.Join(dir, "root-cert.pem"))
	if err != nil {
		return nil, err
	}
	root, err := FirstCert(written)
	if err != nil {
		return nil, fmt.Errorf("root-cert.pem: %w", err)
	}
	istiodRoot, err := FirstCert(rootPEM)
	if err != nil {
		return nil, err
	}
	if !root.Equal(istiodRoot) {
		return nil, fmt.Errorf("root-cert.pem (%s) is not istiod's root (%s)", root.Subject, istiodRoot.Subject)
	}
	return leaf, nil
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out, nil
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// FirstCert returns the first certificate of PEM data.
func FirstCert(data []byte) (*x509.Certificate, error) {
	certs, err := parseCerts(data)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs[0], nil
}

// SubjectOf returns c's subject; istiod's workload certificates have none
// (the identity is the URI SAN).
func SubjectOf(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return s
	}
	return "(empty: the identity is the URI SAN)"
}
