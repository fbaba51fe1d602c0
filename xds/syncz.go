package xds

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"
)

// requested records a request of typeURL answering nonce. When it NACKs
// the latest response, it returns that response's version.
func (st *stream) requested(typeURL, nonce string, nack bool, now time.Time) (nackedVersion string, nacked bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.acks.Requested(typeURL, nonce, nack, now)
}

// sent records a response of typeURL.
func (st *stream) sent(typeURL, nonce, version string, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.acks.Sent(typeURL, nonce, version, now)
}

// configs reports each type's sync state.
func (st *stream) configs() []*statusv3.ClientConfig_GenericXdsConfig {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.acks.Configs()
}

// controlPlaneID is how istiod identifies itself; istioctl prints ID.
type controlPlaneID struct {
	ID string `json:"ID"`
}

// syncz answers istio.io/debug/syncz: one ClientConfig per workload connected
// to this replica (its newest stream), as istiod does, so that `istioctl
// proxy-status` lists them.
func (s *Server) syncz() *discovery.DiscoveryResponse {
	s.mu.Lock()
	newest := map[types.NamespacedName]*stream{}
	for key, set := range s.byWorkload {
		for _, st := range set {
			if !st.counted {
				continue
			}
			if cur := newest[key]; cur == nil || st.opened.After(cur.opened) {
				newest[key] = st
			}
		}
	}
	s.mu.Unlock()

	keys := slices.SortedFunc(maps.Keys(newest), func(a, b types.NamespacedName) int {
		if a.Namespace != b.Namespace {
			if a.Namespace < b.Namespace {
				return -1
			}
			return 1
		}
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	resp := &discovery.DiscoveryResponse{
		TypeUrl:     TypeSyncz,
		VersionInfo: strconv.FormatInt(s.opts.Clock().UnixNano(), 10),
	}
	for _, key := range keys {
		st := newest[key]
		meta := st.proxy.Metadata.GetFields()
		str := func(name, fallback string) *structpb.Value {
			if v := meta[name].GetStringValue(); v != "" {
				return structpb.NewStringValue(v)
			}
			return structpb.NewStringValue(fallback)
		}
		cc := &statusv3.ClientConfig{
			Node: &core.Node{
				Id: key.Name + "." + key.Namespace,
				Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
					"CLUSTER_ID":    str("CLUSTER_ID", s.opts.ClusterID),
					"ISTIO_VERSION": str("ISTIO_VERSION", st.proxy.Registration.Spec.Registration.Sidecar.Istio.Version),
					"NAMESPACE":     structpb.NewStringValue(key.Namespace),
				}},
			},
			GenericXdsConfigs: st.configs(),
		}
		a, err := anypb.New(cc)
		if err != nil {
			s.log.Error("encode syncz ClientConfig", "registration", key.String(), "error", err)
			continue
		}
		resp.Resources = append(resp.Resources, a)
	}
	id, _ := json.Marshal(controlPlaneID{ID: s.opts.Connections.Replica()})
	resp.ControlPlane = &core.ControlPlane{Identifier: string(id)}
	return resp
}
