package endpoint

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// NodeID is the Istio node ID of a registered workload's sidecar:
// sidecar~<ip>~<registration>.<namespace>~<namespace>.svc.cluster.local.
func NodeID(ip, registration, namespace string) string {
	return fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, registration, namespace, namespace)
}

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
		NodeId:           NodeID(we.Spec.Address, res.Registration.Name, res.Registration.Namespace),
		DiscoveryAddress: s.opts.Bootstrap.DiscoveryAddress,
		ClusterId:        s.opts.Bootstrap.ClusterID,
		Network:          we.Spec.Network,
		ServiceAccount:   we.Spec.ServiceAccount,
		TrustDomain:      s.opts.Bootstrap.TrustDomain,
		Labels:           we.Spec.Labels,
		InstanceIp:       we.Spec.Address,
		ProxyConfigJson:  string(pcJSON),
		RootCertificates: s.opts.Bootstrap.RootCertificates,
	}
	if tok := res.SidecarToken; tok != nil {
		boot.SidecarToken = tok.Token
		boot.SidecarTokenExpiresAt = timestamppb.New(tok.ExpiresAt)
	}
	return boot, nil
}
