package configsource

import (
	"bytes"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// ingress is a workload's ingress listener on addr holding chains, as
// translate.Shared.For builds it.
func ingress(addr string, chains ...*listenerv3.FilterChain) *listenerv3.Listener {
	return &listenerv3.Listener{
		Name: addr + "_8080",
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080},
		}}},
		TrafficDirection: corev3.TrafficDirection_INBOUND,
		FilterChains:     chains,
	}
}

func chain(name, transport string) *listenerv3.FilterChain {
	return &listenerv3.FilterChain{Name: name, FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: transport}}
}

// TestDigestOfSharedChains: a listener's shared filter chains are hashed by
// their digest, and its digest still changes with every field, every chain
// and their order, and stays equal for equal content hashed from another
// scope's translation (other objects, equal chains).
func TestDigestOfSharedChains(t *testing.T) {
	mtls, plain := chain("inbound|8080|mtls", "tls"), chain("inbound|8080|plaintext", "")
	shared, err := newSharedParts([]*listenerv3.FilterChain{mtls, plain}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(t *testing.T, chains sharedParts, rs ...types.Resource) []byte {
		t.Helper()
		d, err := digest(resource.ListenerType, rs, chains)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := sum(t, shared, ingress("10.0.0.1", mtls, plain))

	// Another scope translated the same content: other objects, equal.
	mtls2, plain2 := chain("inbound|8080|mtls", "tls"), chain("inbound|8080|plaintext", "")
	shared2, err := newSharedParts([]*listenerv3.FilterChain{mtls2, plain2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(t, shared2, ingress("10.0.0.1", mtls2, plain2)); !bytes.Equal(got, base) {
		t.Errorf("equal content from another scope's chains: digest %x, want %x", got, base)
	}

	withListenerFilter := ingress("10.0.0.1", mtls, plain)
	withListenerFilter.ListenerFilters = []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector"}}
	changed := []struct {
		name   string
		chains sharedParts
		l      *listenerv3.Listener
	}{
		{"other address", shared, ingress("10.0.0.2", mtls, plain)},
		{"a field besides the chains", shared, withListenerFilter},
		{"a chain fewer", shared, ingress("10.0.0.1", mtls)},
		{"chains in another order", shared, ingress("10.0.0.1", plain, mtls)},
		{"a chain not shared in place of a shared one", shared, ingress("10.0.0.1", mtls, chain("inbound|8080|plaintext", "raw_buffer"))},
		{"no chain shared", nil, ingress("10.0.0.1", mtls, plain)},
	}
	for _, tt := range changed {
		t.Run(tt.name, func(t *testing.T) {
			if got := sum(t, tt.chains, tt.l); bytes.Equal(got, base) {
				t.Errorf("digest unchanged (%x)", got)
			}
		})
	}
}

func mustShared(t *testing.T, chains ...*listenerv3.FilterChain) sharedParts {
	t.Helper()
	s, err := newSharedParts(chains, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDigestLeavesTheListenerAlone: hashing reads the listener only.
func TestDigestLeavesTheListenerAlone(t *testing.T) {
	mtls := chain("inbound|8080|mtls", "tls")
	l := ingress("10.0.0.1", mtls)
	shared := mustShared(t, mtls)
	if _, err := digest(resource.ListenerType, []types.Resource{l}, shared); err != nil {
		t.Fatal(err)
	}
	if len(l.FilterChains) != 1 || l.FilterChains[0] != mtls || l.GetAddress().GetSocketAddress().GetAddress() != "10.0.0.1" {
		t.Fatalf("listener changed by digest: %v", l)
	}
}

// TestDigestOfSharedClusters: a shared inbound cluster is hashed by its
// digest: equal content from another scope hashes equal, other content
// differs.
func TestDigestOfSharedClusters(t *testing.T) {
	cluster := func(port uint32) *clusterv3.Cluster {
		return &clusterv3.Cluster{Name: "inbound|8080||", LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: "inbound|8080||",
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}},
			}}}}}}}}
	}
	sum := func(t *testing.T, c *clusterv3.Cluster) []byte {
		t.Helper()
		parts, err := newSharedParts(nil, []*clusterv3.Cluster{c})
		if err != nil {
			t.Fatal(err)
		}
		d, err := digest(resource.ClusterType, []types.Resource{c}, parts)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := sum(t, cluster(8080))
	if got := sum(t, cluster(8080)); !bytes.Equal(got, base) {
		t.Errorf("equal cluster from another scope: digest %x, want %x", got, base)
	}
	if got := sum(t, cluster(9090)); bytes.Equal(got, base) {
		t.Errorf("cluster forwarding elsewhere: digest unchanged (%x)", got)
	}
}
