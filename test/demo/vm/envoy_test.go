package vm

import (
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
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
