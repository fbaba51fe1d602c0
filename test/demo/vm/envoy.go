package vm

import (
	"context"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
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
// here (the tests do that with grpc-go's xDS client). It keeps the
// endpoints of every EDS response in eds (when not nil), as Envoy's endpoint
// table.
func PlayEnvoy(ctx context.Context, c *istioagent.Client) error {
	return playEnvoy(ctx, c, nil)
}

func playEnvoy(ctx context.Context, c *istioagent.Client, eds *edsLog) error {
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
		case resource.EndpointType:
			eds.record(resp)
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

// edsLog is what the sidecar was sent over EDS, by cluster: the latest
// endpoints ("ip:port") and every endpoint ever sent, across restarts of
// the sidecar (istiod sends only the clusters that changed: the others
// keep their latest).
type edsLog struct {
	mu     sync.Mutex
	latest map[string][]string
	ever   map[string]map[string]bool
}

func newEDSLog() *edsLog {
	return &edsLog{latest: map[string][]string{}, ever: map[string]map[string]bool{}}
}

// record keeps the endpoints of each ClusterLoadAssignment of resp.
func (l *edsLog) record(resp *discovery.DiscoveryResponse) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range resp.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if a.UnmarshalTo(cla) != nil {
			continue
		}
		name := cla.GetClusterName()
		addrs := claAddresses(cla)
		l.latest[name] = addrs
		if l.ever[name] == nil {
			l.ever[name] = map[string]bool{}
		}
		for _, a := range addrs {
			l.ever[name][a] = true
		}
	}
}

// endpoints returns cluster's latest endpoints and every endpoint it ever
// had, sorted, and whether EDS ever held cluster.
func (l *edsLog) endpoints(cluster string) (latest, ever []string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	latest, ok = l.latest[cluster]
	for a := range l.ever[cluster] {
		ever = append(ever, a)
	}
	sort.Strings(ever)
	return slices.Clone(latest), ever, ok
}

// claAddresses returns the socket addresses ("ip:port") of cla's
// endpoints, sorted.
func claAddresses(cla *endpointv3.ClusterLoadAssignment) []string {
	addrs := []string{}
	for _, le := range cla.GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addrs = append(addrs, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
		}
	}
	sort.Strings(addrs)
	return addrs
}
