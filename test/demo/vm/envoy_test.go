package vm

import (
	"net"
	"slices"
	"strconv"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func response(t *testing.T, msgs ...proto.Message) *discovery.DiscoveryResponse {
	t.Helper()
	resp := &discovery.DiscoveryResponse{}
	for _, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

func edsCluster(name, service string) *cluster.Cluster {
	c := &cluster.Cluster{Name: name, ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS}}
	if service != "" {
		c.EdsClusterConfig = &cluster.Cluster_EdsClusterConfig{ServiceName: service}
	}
	return c
}

func TestEDSClusters(t *testing.T) {
	tests := []struct {
		name     string
		clusters []proto.Message
		want     []string
	}{
		{"none", nil, nil},
		{"only static clusters", []proto.Message{&cluster.Cluster{Name: "BlackHoleCluster", ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}}}, nil},
		{"EDS clusters by name or service name, sorted, once", []proto.Message{
			edsCluster("outbound|8080||ratings.bookinfo.svc.cluster.local", ""),
			edsCluster("b", "outbound|9080||reviews.bookinfo.svc.cluster.local"),
			&cluster.Cluster{Name: "PassthroughCluster", ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST}},
			edsCluster("outbound|8080||ratings.bookinfo.svc.cluster.local", ""),
		}, []string{"outbound|8080||ratings.bookinfo.svc.cluster.local", "outbound|9080||reviews.bookinfo.svc.cluster.local"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := edsClusters(response(t, tt.clusters...)); !slices.Equal(got, tt.want) {
				t.Errorf("edsClusters = %v, want %v", got, tt.want)
			}
		})
	}
}

func filter(t *testing.T, m proto.Message) *listener.Filter {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return &listener.Filter{Name: "f", ConfigType: &listener.Filter_TypedConfig{TypedConfig: a}}
}

func rdsManager(name string) *hcm.HttpConnectionManager {
	return &hcm.HttpConnectionManager{RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{RouteConfigName: name}}}
}

func TestRDSRoutes(t *testing.T) {
	inline := &hcm.HttpConnectionManager{RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{}}
	tests := []struct {
		name      string
		listeners []proto.Message
		want      []string
	}{
		{"none", nil, nil},
		{"TCP proxy and inline routes only", []proto.Message{&listener.Listener{Name: "virtualInbound", FilterChains: []*listener.FilterChain{
			{Filters: []*listener.Filter{filter(t, &tcpproxy.TcpProxy{StatPrefix: "x"})}},
			{Filters: []*listener.Filter{filter(t, inline)}},
		}}}, nil},
		{"RDS names of every chain and the default chain, sorted, once", []proto.Message{
			&listener.Listener{Name: "127.0.0.2_8080", FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{filter(t, rdsManager("8080"))}}}},
			&listener.Listener{Name: "0.0.0.0_9080", DefaultFilterChain: &listener.FilterChain{Filters: []*listener.Filter{filter(t, rdsManager("9080"))}},
				FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{filter(t, rdsManager("8080"))}}}},
		}, []string{"8080", "9080"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rdsRoutes(response(t, tt.listeners...)); !slices.Equal(got, tt.want) {
				t.Errorf("rdsRoutes = %v, want %v", got, tt.want)
			}
		})
	}
}

func cla(name string, addrs ...string) *endpointv3.ClusterLoadAssignment {
	c := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	le := &endpointv3.LocalityLbEndpoints{}
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		p, _ := strconv.Atoi(port)
		le.LbEndpoints = append(le.LbEndpoints, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Address: host, PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(p)},
			}}},
		}}})
	}
	c.Endpoints = []*endpointv3.LocalityLbEndpoints{le}
	return c
}

func TestEDSLog(t *testing.T) {
	const pp, r = "outbound|8080||productpage.bookinfo.svc.cluster.local", "outbound|8080||ratings.bookinfo.svc.cluster.local"
	tests := []struct {
		name                 string
		responses            [][]proto.Message
		cluster              string
		wantLatest, wantEver []string
		wantOK               bool
	}{
		{"never sent", [][]proto.Message{{cla(r, "127.0.1.1:8080")}}, pp, nil, nil, false},
		{"latest and ever, sorted", [][]proto.Message{
			{cla(pp, "10.244.0.9:8080")},
			{cla(pp, "203.0.113.10:15443", "10.0.0.1:8080")},
		}, pp, []string{"10.0.0.1:8080", "203.0.113.10:15443"}, []string{"10.0.0.1:8080", "10.244.0.9:8080", "203.0.113.10:15443"}, true},
		{"a response without the cluster keeps its latest", [][]proto.Message{
			{cla(pp, "203.0.113.10:15443")},
			{cla(r, "127.0.1.1:8080")},
		}, pp, []string{"203.0.113.10:15443"}, []string{"203.0.113.10:15443"}, true},
		{"no endpoints", [][]proto.Message{{cla(pp)}}, pp, []string{}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newEDSLog()
			for _, msgs := range tt.responses {
				l.record(response(t, msgs...))
			}
			latest, ever, ok := l.endpoints(tt.cluster)
			if ok != tt.wantOK || !slices.Equal(latest, tt.wantLatest) || !slices.Equal(ever, tt.wantEver) {
				t.Errorf("endpoints(%s) = %v, %v, %v; want %v, %v, %v", tt.cluster, latest, ever, ok, tt.wantLatest, tt.wantEver, tt.wantOK)
			}
		})
	}
}
