package xds

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/xds/nodepin"
)

// FuzzRequest: every field of a request the server reads comes from the
// proxy (node ID and metadata, type URL, nonce and version, the error
// detail of a HealthInformation report, syncz requests). A request never
// panics the server: a switched node ends the stream PermissionDenied, a
// debug type on a workload stream is refused, so is a type no sidecar asks
// for (InvalidArgument), a health report passes on
// exactly its error detail, and syncz renders whatever metadata was sent.
func FuzzRequest(f *testing.F) {
	first := &core.Node{Id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"CLUSTER_ID": structpb.NewStringValue("c1"),
	}}}
	for _, req := range []*discovery.DiscoveryRequest{
		{TypeUrl: resource.ListenerType},
		{Node: first, TypeUrl: resource.ClusterType, VersionInfo: "1", ResponseNonce: "n1"},
		{Node: &core.Node{Id: "sidecar~10.0.0.2~b.ns~ns.svc.cluster.local"}, TypeUrl: resource.ListenerType},
		{TypeUrl: TypeHealthInformation, ErrorDetail: &rpcstatus.Status{Code: 13, Message: "probe failed"}},
		{TypeUrl: TypeSyncz, Node: &core.Node{Id: "debug~0.0.0.0~istioctl~.svc.cluster.local"}},
		{TypeUrl: "istio.io/debug/connections"},
		{TypeUrl: "", ResponseNonce: "x", ErrorDetail: &rpcstatus.Status{}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, debug bool) {
		req := &discovery.DiscoveryRequest{}
		if proto.Unmarshal(raw, req) != nil {
			return
		}
		health := &recordingHealth{}
		s := &Server{opts: Options{Health: health, Clock: time.Now, ClusterID: "Kubernetes"}, ctx: context.Background(), log: slog.New(slog.DiscardHandler),
			byWorkload: map[types.NamespacedName][]*stream{}}
		st := s.newStream()
		st.debug = debug
		if !debug {
			st.proxy = &Proxy{Workload: registry.StreamWorkload{Key: types.NamespacedName{Namespace: "ns", Name: "a"}}, NodeID: first.GetId(),
				Metadata: req.GetNode().GetMetadata(), Registration: &runtimev1alpha1.WorkloadAutoRegistration{}}
			st.counted = true
		}

		// The node guard: another node ends the stream.
		var g nodepin.Guard
		g.Pin(first)
		err := g.Check(req)
		same := req.GetNode() == nil || proto.Equal(req.GetNode(), first)
		if same != (err == nil) {
			t.Fatalf("node %v: refused=%v", req.GetNode(), err)
		}
		if err != nil && !errors.Is(err, nodepin.ErrSwitched) {
			t.Fatalf("switched node refused with %v", err)
		}

		// The type URL decides what the request means.
		track, err := s.checkType(st, req.GetTypeUrl(), req.GetErrorDetail())
		isDebug := strings.HasPrefix(req.GetTypeUrl(), debugTypePrefix)
		switch {
		case debug && req.GetTypeUrl() != TypeSyncz || !debug && isDebug:
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("type %q on debug=%v: %v, want PermissionDenied", req.GetTypeUrl(), debug, err)
			}
		case !debug && !slices.Contains(WorkloadTypes, req.GetTypeUrl()):
			if status.Code(err) != codes.InvalidArgument || track {
				t.Fatalf("type %q on a workload stream: %v (track %v), want InvalidArgument", req.GetTypeUrl(), err, track)
			}
		case err != nil:
			t.Fatalf("type %q on debug=%v: %v", req.GetTypeUrl(), debug, err)
		case !debug && req.GetTypeUrl() == TypeHealthInformation:
			got := health.all()
			if track || len(got) != 1 || got[0].Healthy != (req.GetErrorDetail() == nil) || got[0].Message != req.GetErrorDetail().GetMessage() {
				t.Fatalf("health report of %v: %+v (track %v)", req.GetErrorDetail(), got, track)
			}
		}
		if track {
			st.requested(req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail() != nil, time.Now())
			st.sent(req.GetTypeUrl(), req.GetResponseNonce(), req.GetVersionInfo(), time.Now())
			st.requested(req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail() != nil, time.Now())
		}

		// syncz renders the stream with the metadata it sent.
		if !debug {
			s.byWorkload[st.proxy.Workload.Key] = []*stream{st}
			// syncz asks the tracker only its replica name: it writes nothing.
			conns, err := presence.NewConnections(context.Background(), presence.ConnectionOptions{Client: unusedClient{}, Replica: "r"})
			if err != nil {
				t.Fatal(err)
			}
			s.opts.Connections = conns
			resp := s.syncz()
			if len(resp.GetResources()) != 1 {
				t.Fatalf("syncz listed %d proxies, want 1", len(resp.GetResources()))
			}
		}
	})
}

// unusedClient is a client nothing calls (any call would panic).
type unusedClient struct{ client.Client }
