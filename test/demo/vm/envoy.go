package vm

import (
	"context"
	"slices"
	"sort"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/test/istioagent"
)

// PlayEnvoy plays the part of the Envoy pilot-agent would run (there is no
// Envoy binary here) on c, a stream on pilot-agent's XDS socket, until the
// stream ends. As Envoy does on an ADS stream: it subscribes to every
// cluster and listener (CDS, LDS), then to the endpoints of the EDS clusters
// it was sent (EDS) and to the route configurations its HTTP listeners name
// (RDS), changing those subscriptions when clusters or listeners change, and
// ACKs every response. So istioctl proxy-status shows all four types SYNCED
// for the VM, as for a pod. It never NACKs: what it gets is not validated
// here (the tests do that with grpc-go's xDS client).
func PlayEnvoy(ctx context.Context, c *istioagent.Client) error {
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := c.Send(typ, nil, "", ""); err != nil {
			return err
		}
	}
	// The latest version and nonce of each type, which a changed
	// subscription repeats (Envoy's requests always carry both).
	last := map[string]*discovery.DiscoveryResponse{}
	subscribed := map[string][]string{}
	resubscribe := func(typ string, names []string) error {
		if slices.Equal(subscribed[typ], names) {
			return nil
		}
		subscribed[typ] = names
		version, nonce := "", ""
		if r := last[typ]; r != nil {
			version, nonce = r.GetVersionInfo(), r.GetNonce()
		}
		return c.Send(typ, names, version, nonce)
	}
	for {
		resp, err := c.Recv(ctx)
		if err != nil {
			return err
		}
		typ := resp.GetTypeUrl()
		last[typ] = resp
		if err := c.ACK(resp); err != nil {
			return err
		}
		switch typ {
		case resource.ClusterType:
			err = resubscribe(resource.EndpointType, edsClusters(resp))
		case resource.ListenerType:
			err = resubscribe(resource.RouteType, rdsRoutes(resp))
		}
		if err != nil {
			return err
		}
	}
}

// edsClusters returns the names Envoy asks EDS for: those of the EDS
// clusters of a CDS response (their service_name when set), sorted.
func edsClusters(resp *discovery.DiscoveryResponse) []string {
	var names []string
	for _, a := range resp.GetResources() {
		c := &cluster.Cluster{}
		if a.UnmarshalTo(c) != nil || c.GetType() != cluster.Cluster_EDS {
			continue
		}
		name := c.GetEdsClusterConfig().GetServiceName()
		if name == "" {
			name = c.GetName()
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// rdsRoutes returns the route configuration names the HTTP connection
// managers of an LDS response fetch by RDS, sorted.
func rdsRoutes(resp *discovery.DiscoveryResponse) []string {
	var names []string
	for _, a := range resp.GetResources() {
		l := &listener.Listener{}
		if a.UnmarshalTo(l) != nil {
			continue
		}
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(chains, l.GetDefaultFilterChain())
		}
		for _, fc := range chains {
			for _, f := range fc.GetFilters() {
				m := &hcm.HttpConnectionManager{}
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(m) != nil {
					continue
				}
				if n := m.GetRds().GetRouteConfigName(); n != "" {
					names = append(names, n)
				}
			}
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}
