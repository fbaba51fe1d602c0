package configsource

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/fixtures"
)

// edsStream is a SotW ADS client that subscribes to listeners, clusters and
// the endpoints of every EDS cluster it is sent, ACKing everything, and
// keeps the latest endpoints by cluster.
type edsStream struct {
	mu        sync.Mutex
	endpoints map[string][]string // cluster -> "ip:port"
	err       error
}

func subscribeEDS(t *testing.T, e *endpoint, w *workload) *edsStream {
	t.Helper()
	ads := openSidecar(t, e, w, resource.ClusterType, resource.ListenerType)
	s := &edsStream{endpoints: map[string][]string{}}
	go func() {
		var edsNames []string
		for {
			resp, err := ads.Next()
			if err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
			switch resp.GetTypeUrl() {
			case resource.ClusterType:
				var names []string
				for _, a := range resp.GetResources() {
					c := &clusterv3.Cluster{}
					if err := a.UnmarshalTo(c); err == nil && c.GetType() == clusterv3.Cluster_EDS {
						names = append(names, c.GetName())
					}
				}
				slices.Sort(names)
				if err := ads.ACK(resp); err != nil {
					return
				}
				// A changed subscription carries the last EDS version and
				// nonce, as Envoy's does.
				if !slices.Equal(names, edsNames) {
					edsNames = names
					if err := ads.Request(resource.EndpointType, names...); err != nil {
						return
					}
				}
				continue
			case resource.EndpointType:
				got := map[string][]string{}
				for _, a := range resp.GetResources() {
					cla := &endpointv3.ClusterLoadAssignment{}
					if err := a.UnmarshalTo(cla); err != nil {
						continue
					}
					var eps []string
					for _, l := range cla.GetEndpoints() {
						for _, lb := range l.GetLbEndpoints() {
							sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
							eps = append(eps, sa.GetAddress())
						}
					}
					got[cla.GetClusterName()] = eps
				}
				s.mu.Lock()
				s.endpoints = got
				s.mu.Unlock()
			}
			// The ACK of an EDS response names the clusters subscribed to.
			if err := ads.ACK(resp); err != nil {
				return
			}
		}
	}()
	return s
}

func (s *edsStream) waitEndpoints(t *testing.T, what, cluster string, ok func([]string) bool) {
	t.Helper()
	var got []string
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		eps, seen := s.endpoints[cluster]
		got = eps
		return seen && ok(eps), nil
	})
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		t.Fatalf("%s: endpoints of %s are %v (all %v, stream error %v)", what, cluster, got, s.endpoints, s.err)
	}
}

// TestUnhealthyWorkloadLeavesTheEDSOfOthers registers a reviews VM whose
// WorkloadGroup has a probe and a ratings VM that calls it; the ratings VM's
// EDS for reviews follows the reviews VM's health as the HealthMirror
// stores it: absent until the first success, present while healthy, gone
// again once unhealthy.
func TestUnhealthyWorkloadLeavesTheEDSOfOthers(t *testing.T) {
	e := startEndpoint(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	client1 := register(t, e, ns, "10.0.0.20") // ratings: the client
	if err := env.Client.Create(ctx, seed004Sidecar(ns)); err != nil {
		t.Fatal(err)
	}

	// The reviews VM, of a group with a probe.
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "reviews", Namespace: ns}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "reviews"}, ServiceAccount: "reviews-vm"}
	wg.Spec.Probe = &istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Path: "/ready", Port: 8080}}}
	fixtures.CreateGroup(ctx, t, env.Client, wg)
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: e.cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000e"), Registration: fixtures.Registration("10.0.0.30")})
	if err != nil {
		t.Fatal(err)
	}
	reviews := registry.StreamWorkload{Key: client.ObjectKeyFromObject(res.Registration), UID: res.Registration.UID, Group: "reviews"}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "reviews", Namespace: ns}}
	svc.Spec.Selector = map[string]string{"app": "reviews"}
	svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
	if err := env.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}

	// The reviews VM's sidecar is connected to this replica ("replica-a").
	mctx, stop := context.WithCancel(context.Background())
	conns, err := presence.NewConnections(mctx, presence.ConnectionOptions{Client: env.Client, Replica: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := presence.NewHealthMirror(mctx, presence.HealthOptions{Client: env.Client, Connections: conns, Damping: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); conns.Wait(); mirror.Wait() })
	conns.Opened(reviews, 1)

	s := subscribeEDS(t, e, client1)
	cluster := "outbound|8080||reviews." + ns + ".svc.cluster.local"
	// Registered with a probe, no report yet: unhealthy, no endpoint.
	s.waitEndpoints(t, "before the first probe", cluster, func(eps []string) bool { return len(eps) == 0 })

	mirror.ReportHealth(ctx, reviews, registry.HealthReport{Healthy: true, At: time.Now()})
	s.waitEndpoints(t, "after the first passing probe", cluster, func(eps []string) bool { return slices.Equal(eps, []string{"10.0.0.30"}) })

	mirror.ReportHealth(ctx, reviews, registry.HealthReport{Healthy: false, Message: "HTTP probe failed with statuscode: 503", At: time.Now()})
	s.waitEndpoints(t, "after the probe failed", cluster, func(eps []string) bool { return len(eps) == 0 })
}
