package endpoint

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
)

// bootstrap returns what the workload's sidecar needs to start, from the
// registration's WorkloadGroup snapshot (never the live group).
func (s *Server) bootstrap(res *registry.Result) (*onboardingv1alpha1.SidecarBootstrap, error) {
	group, err := registry.GroupSpec(res.Registration.Spec.WorkloadGroup)
	if err != nil {
		return nil, err
	}
	pc := &meshconfig.ProxyConfig{
		DiscoveryAddress: s.opts.Bootstrap.DiscoveryAddress,
		ReadinessProbe:   group.GetProbe(),
	}
	pcJSON, err := protojson.Marshal(pc)
	if err != nil {
		return nil, fmt.Errorf("encode ProxyConfig: %w", err)
	}
	we := res.WorkloadEntry
	boot := &onboardingv1alpha1.SidecarBootstrap{
		NodeId:           nodeid.Build(we.Spec.Address, client.ObjectKeyFromObject(res.Registration)),
		DiscoveryAddress: s.opts.Bootstrap.DiscoveryAddress,
		ClusterId:        s.opts.Bootstrap.ClusterID,
		Network:          we.Spec.Network,
		ServiceAccount:   we.Spec.ServiceAccount,
		TrustDomain:      s.opts.Bootstrap.TrustDomain,
		Labels:           we.Spec.Labels,
		InstanceIp:       we.Spec.Address,
		ProxyConfigJson:  string(pcJSON),
	}
	roots, err := s.roots.get()
	if err != nil {
		return nil, err
	}
	boot.RootCertificates = roots
	if tok := res.SidecarToken; tok != nil {
		boot.SidecarToken = tok.Token
		boot.SidecarTokenExpiresAt = timestamppb.New(tok.ExpiresAt)
	}
	return boot, nil
}

// rootCerts gives the PEM roots of the bootstrap: fixed bytes, or a file
// read each time with the last good content kept.
type rootCerts struct {
	fixed []byte
	file  string

	mu       sync.Mutex
	lastGood []byte
}

func (r *rootCerts) get() ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	if r.file == "" {
		return r.fixed, nil
	}
	data, err := ReadRootCertificates(r.file)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.lastGood = data
		return data, nil
	}
	if r.lastGood != nil {
		return r.lastGood, nil
	}
	return nil, err
}

// ReadRootCertificates reads a PEM file that must hold at least one
// parseable certificate and nothing else.
func ReadRootCertificates(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read root certificates: %w", err)
	}
	rest, n := data, 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("root certificates %s: unexpected PEM block %q", file, block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("root certificates %s: certificate %d: %w", file, n+1, err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("root certificates %s: %w", file, errNoCertificate)
	}
	return data, nil
}

var errNoCertificate = errors.New("no PEM certificate")
