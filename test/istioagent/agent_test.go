package istioagent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
)

const (
	// waitTimeout bounds every wait for something pilot-agent or the server
	// does; generous, as the machines running this have 2 cores.
	waitTimeout = 60 * time.Second

	healthInfoType = "type.googleapis.com/istio.v1.HealthInformation"
	synczType      = "istio.io/debug/syncz"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestAgentRelaysUpstreamStream checks what pilot-agent sends upstream (node,
// metadata, token, headers), that a published Cluster reaches the client
// through it, that the client's ACK reaches the server, and that the upstream
// stream ends when the agent stops.
func TestAgentRelaysUpstreamStream(t *testing.T) {
	t.Parallel()
	srv := startXDSServer(t, nil)
	opts := istioagent.Options{
		NoCA:             true,
		DiscoveryAddress: srv.addr,
		PodName:          "ratings-vm",
		PodNamespace:     "bookinfo",
		InstanceIP:       "10.1.2.3",
		ClusterID:        "cluster-1",
		ServiceAccount:   "ratings",
		Labels:           map[string]string{"app": "ratings", "version": "v1"},
		XDSHeaders:       map[string]string{"x-embark-vm": "ratings-1"},
		Token:            "token-1",
	}
	nodeID := fixtures.NodeID(opts.InstanceIP, k8stypes.NamespacedName{Namespace: opts.PodNamespace, Name: opts.PodName})
	srv.publishCluster(t, nodeID, "1", "outbound|9080||ratings.bookinfo.svc.cluster.local")

	agent := istioagent.Start(t, opts)
	client, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Send(resourcev3.ClusterType, nil, "", ""); err != nil {
		t.Fatal(err)
	}

	resp := recvType(t, client, resourcev3.ClusterType)
	if got := clusterNames(t, resp); len(got) != 1 || got[0] != "outbound|9080||ratings.bookinfo.svc.cluster.local" {
		t.Errorf("clusters through pilot-agent = %v, want the published one", got)
	}
	if err := client.ACK(resp); err != nil {
		t.Fatal(err)
	}

	st := srv.waitStream(t, "an upstream stream with a node", func(s *streamRecord) bool { return s.node != nil })
	if got := st.node.GetId(); got != nodeID {
		t.Errorf("node ID = %q, want %q", got, nodeID)
	}
	meta := st.node.GetMetadata().GetFields()
	if got := meta["CLUSTER_ID"].GetStringValue(); got != "cluster-1" {
		t.Errorf("metadata CLUSTER_ID = %q, want cluster-1", got)
	}
	if got := meta["NAMESPACE"].GetStringValue(); got != "bookinfo" {
		t.Errorf("metadata NAMESPACE = %q, want bookinfo", got)
	}
	if got := meta["SERVICE_ACCOUNT"].GetStringValue(); got != "ratings" {
		t.Errorf("metadata SERVICE_ACCOUNT = %q, want ratings", got)
	}
	agentNode, err := agent.Node()
	if err != nil {
		t.Fatal(err)
	}
	wantVersion := agentNode.GetMetadata().GetFields()["ISTIO_VERSION"].GetStringValue()
	if got := meta["ISTIO_VERSION"].GetStringValue(); got == "" || got != wantVersion {
		t.Errorf("metadata ISTIO_VERSION = %q, want pilot-agent's %q", got, wantVersion)
	}
	if got := meta["PROXY_CONFIG"].GetStructValue().GetFields()["discoveryAddress"].GetStringValue(); got != srv.addr {
		t.Errorf("metadata PROXY_CONFIG.discoveryAddress = %q, want %q", got, srv.addr)
	}
	if got := meta["LABELS"].GetStructValue().GetFields()["app"].GetStringValue(); got != "ratings" {
		t.Errorf("metadata LABELS.app = %q, want ratings", got)
	}
	if _, ok := meta["GENERATOR"]; ok {
		t.Errorf("metadata has GENERATOR (pilot-agent's proxyless-gRPC marker): %v", meta["GENERATOR"])
	}
	wantHeaders := map[string]string{
		"authorization": "Bearer token-1",
		"x-embark-vm":   "ratings-1",
		"clusterid":     "cluster-1",
	}
	for k, want := range wantHeaders {
		if got := st.md.Get(k); len(got) != 1 || got[0] != want {
			t.Errorf("upstream header %s = %q, want %q", k, got, want)
		}
	}
	if st.tls {
		t.Error("upstream stream uses TLS, want plaintext with controlPlaneAuthPolicy NONE")
	}

	srv.waitStream(t, "the client's CDS ACK", func(s *streamRecord) bool {
		for _, r := range s.requests {
			if r.GetTypeUrl() == resourcev3.ClusterType && r.GetVersionInfo() == "1" && r.GetResponseNonce() == resp.GetNonce() && r.GetErrorDetail() == nil {
				return true
			}
		}
		return false
	})

	agent.Stop()
	if agent.Running() {
		t.Error("agent still running after Stop")
	}
	srv.waitStream(t, "the upstream stream to end after Stop", func(s *streamRecord) bool { return s.id == st.id && s.closed })
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if _, err := client.Recv(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("client stream after the agent stopped: Recv error = %v, want the stream's end", err)
	}
}

// TestAgentTokenRotation checks that each new upstream stream carries the
// current token file, and none once it is removed.
func TestAgentTokenRotation(t *testing.T) {
	t.Parallel()
	srv := startXDSServer(t, nil)
	agent := istioagent.Start(t, istioagent.Options{NoCA: true, DiscoveryAddress: srv.addr, Token: "token-a"})

	for i, token := range []string{"token-a", "token-b", ""} {
		if i > 0 {
			agent.SetToken(token)
		}
		client, err := istioagent.Connect(t.Context(), agent)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Send(resourcev3.ClusterType, nil, "", ""); err != nil {
			t.Fatal(err)
		}
		st := srv.waitStream(t, fmt.Sprintf("upstream stream #%d", i+1), func(s *streamRecord) bool { return s.seq == i && s.node != nil })
		want := []string{"Bearer " + token}
		if token == "" {
			want = nil
		}
		if got := st.md.Get("authorization"); !slices.Equal(got, want) {
			t.Errorf("stream #%d: authorization = %q, want %q", i+1, got, want)
		}
		if err := client.Close(); err != nil {
			t.Fatal(err)
		}
		srv.waitStream(t, fmt.Sprintf("upstream stream #%d to end after the client closed", i+1), func(s *streamRecord) bool { return s.seq == i && s.closed })
	}
}

// TestAgentWorkDir checks that a given working directory is pilot-agent's
// root: a token file written there beforehand (as the onboarding agent
// writes it on a VM) is sent upstream, and the directory is kept.
func TestAgentWorkDir(t *testing.T) {
	t.Parallel()
	srv := startXDSServer(t, nil)
	// Not t.TempDir(): its long path leaves no room for the XDS socket.
	dir, err := os.MkdirTemp("", "wd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	root := filepath.Join(dir, "vm")
	tokenFile := filepath.Join(root, "var/run/secrets/tokens/istio-token")
	if err := os.MkdirAll(filepath.Dir(tokenFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("written-by-the-vm"), 0o600); err != nil {
		t.Fatal(err)
	}
	agent := istioagent.Start(t, istioagent.Options{NoCA: true, DiscoveryAddress: srv.addr, WorkDir: root})
	if agent.WorkDir() != root {
		t.Errorf("WorkDir() = %s, want %s", agent.WorkDir(), root)
	}
	client, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Send(resourcev3.ClusterType, nil, "", ""); err != nil {
		t.Fatal(err)
	}
	st := srv.waitStream(t, "upstream stream", func(s *streamRecord) bool { return s.seq == 0 && s.node != nil })
	if got := st.md.Get("authorization"); !slices.Equal(got, []string{"Bearer written-by-the-vm"}) {
		t.Errorf("authorization = %q, want the token file written before the start", got)
	}
	agent.Stop()
	if _, err := os.Stat(tokenFile); err != nil {
		t.Errorf("the given working directory was not kept: %v", err)
	}
}

// TestAgentRestart checks that a restarted agent serves a new client and opens
// a new upstream stream, the old one having ended.
func TestAgentRestart(t *testing.T) {
	t.Parallel()
	srv := startXDSServer(t, nil)
	opts := istioagent.Options{NoCA: true, DiscoveryAddress: srv.addr, PodName: "vm-r", PodNamespace: "ns-r"}
	srv.publishCluster(t, fixtures.NodeID("127.0.0.1", k8stypes.NamespacedName{Namespace: "ns-r", Name: "vm-r"}), "1", "c1")
	agent := istioagent.Start(t, opts)

	for run := range 2 {
		if run > 0 {
			agent.Restart()
			if !agent.Running() {
				t.Fatal("agent not running after Restart")
			}
		}
		client, err := istioagent.Connect(t.Context(), agent)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Send(resourcev3.ClusterType, nil, "", ""); err != nil {
			t.Fatal(err)
		}
		if got := clusterNames(t, recvType(t, client, resourcev3.ClusterType)); !slices.Equal(got, []string{"c1"}) {
			t.Errorf("run %d: clusters = %v, want [c1]", run, got)
		}
		srv.waitStream(t, fmt.Sprintf("upstream stream of run %d", run), func(s *streamRecord) bool { return s.seq == run && s.node != nil })
	}
	srv.waitStream(t, "the first run's upstream stream to end", func(s *streamRecord) bool { return s.seq == 0 && s.closed })
}

// TestAgentHealthInformation checks that pilot-agent probes the workload as its
// ProxyConfig's readinessProbe says and reports it upstream as
// HealthInformation requests: healthy first, then unhealthy with the reason.
func TestAgentHealthInformation(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	healthy.Store(true)
	var probes atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		if r.URL.Path != "/ready" || !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(app.Close)
	appURL, err := url.Parse(app.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(appURL.Port())
	if err != nil {
		t.Fatal(err)
	}

	srv := startXDSServer(t, nil)
	agent := istioagent.Start(t, istioagent.Options{
		NoCA:             true,
		DiscoveryAddress: srv.addr,
		ProxyConfig: &meshconfig.ProxyConfig{
			ReadinessProbe: &networkingv1alpha3.ReadinessProbe{
				PeriodSeconds: 1,
				HealthCheckMethod: &networkingv1alpha3.ReadinessProbe_HttpGet{HttpGet: &networkingv1alpha3.HTTPHealthCheckConfig{
					Host: "127.0.0.1",
					Port: uint32(port),
					Path: "/ready",
				}},
			},
		},
	})
	client, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	// pilot-agent sends health only once the client has asked for listeners,
	// as Envoy does right after clusters.
	for _, typeURL := range []string{resourcev3.ClusterType, resourcev3.ListenerType} {
		if err := client.Send(typeURL, nil, "", ""); err != nil {
			t.Fatal(err)
		}
	}

	srv.waitStream(t, "a healthy HealthInformation request", func(s *streamRecord) bool {
		for _, r := range s.requests {
			if r.GetTypeUrl() == healthInfoType && r.GetErrorDetail() == nil {
				return true
			}
		}
		return false
	})
	if probes.Load() == 0 {
		t.Error("the application was never probed")
	}

	healthy.Store(false)
	st := srv.waitStream(t, "an unhealthy HealthInformation request", func(s *streamRecord) bool {
		for _, r := range s.requests {
			if r.GetTypeUrl() == healthInfoType && r.GetErrorDetail() != nil {
				return true
			}
		}
		return false
	})
	var health []string // the HealthInformation requests in order
	for _, r := range st.requests {
		if r.GetTypeUrl() != healthInfoType {
			continue
		}
		if r.GetErrorDetail() == nil {
			health = append(health, "healthy")
			continue
		}
		health = append(health, "unhealthy")
		if msg := r.GetErrorDetail().GetMessage(); !strings.Contains(msg, "500") {
			t.Errorf("unhealthy detail = %q, want the probe's status 500", msg)
		}
	}
	// pilot-agent may repeat its first report when the probe races the
	// client's first listener request; the transitions are what count.
	if got := slices.Compact(slices.Clone(health)); !slices.Equal(got, []string{"healthy", "unhealthy"}) {
		t.Errorf("HealthInformation requests = %v, want healthy, then unhealthy", health)
	}
}

// TestAgentMutualTLS checks the TLS upstream of controlPlaneAuthPolicy
// MUTUAL_TLS: pilot-agent verifies the server with Options.XDSRootCA and still
// sends its token.
func TestAgentMutualTLS(t *testing.T) {
	t.Parallel()
	caPEM, serverCert := serverTLS(t)
	srv := startXDSServer(t, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}))
	srv.publishCluster(t, fixtures.NodeID("127.0.0.1", k8stypes.NamespacedName{Namespace: "default", Name: "vm-1"}), "7", "tls-cluster")
	agent := istioagent.Start(t, istioagent.Options{
		NoCA:             true,
		DiscoveryAddress: srv.addr,
		ProxyConfig:      &meshconfig.ProxyConfig{ControlPlaneAuthPolicy: meshconfig.AuthenticationPolicy_MUTUAL_TLS},
		XDSRootCA:        caPEM,
		Token:            "tls-token",
	})
	client, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Send(resourcev3.ClusterType, nil, "", ""); err != nil {
		t.Fatal(err)
	}
	if got := clusterNames(t, recvType(t, client, resourcev3.ClusterType)); !slices.Equal(got, []string{"tls-cluster"}) {
		t.Errorf("clusters = %v, want [tls-cluster]", got)
	}
	st := srv.waitStream(t, "an upstream stream with a node", func(s *streamRecord) bool { return s.node != nil })
	if !st.tls {
		t.Error("upstream stream is not TLS")
	}
	if got := st.md.Get("authorization"); !slices.Equal(got, []string{"Bearer tls-token"}) {
		t.Errorf("authorization = %q, want [Bearer tls-token]", got)
	}
}

// TestIstioctlProxyStatus checks what istioctl proxy-status prints for one
// ClientConfig answered on istio.io/debug/syncz.
func TestIstioctlProxyStatus(t *testing.T) {
	t.Parallel()
	cpID := `{"Component":"istiod","ID":"embark-0","Info":{"version":"0.1.0"}}`
	cc := &statusv3.ClientConfig{
		Node: &corev3.Node{
			Id: "ratings-vm.bookinfo",
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"CLUSTER_ID":    structpb.NewStringValue("cluster-1"),
				"ISTIO_VERSION": structpb.NewStringValue("1.31-dev"),
				"NAMESPACE":     structpb.NewStringValue("bookinfo"),
			}},
		},
		GenericXdsConfigs: []*statusv3.ClientConfig_GenericXdsConfig{
			{TypeUrl: resourcev3.ClusterType, ConfigStatus: statusv3.ConfigStatus_SYNCED},
			{TypeUrl: resourcev3.ListenerType, ConfigStatus: statusv3.ConfigStatus_SYNCED},
		},
	}
	srv := startSynczServer(t, cpID, cc)

	ctx, cancel := context.WithTimeout(t.Context(), 2*waitTimeout)
	defer cancel()
	out, err := istioagent.Istioctl(ctx, t, "proxy-status", "--xds-address", srv.addr, "--plaintext", "-r", "default")
	if err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out)
	}
	t.Logf("istioctl proxy-status:\n%s", out)
	var rows [][]string
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		rows = append(rows, columns.Split(strings.TrimSpace(line), -1))
	}
	want := [][]string{
		{"NAME", "CLUSTER", "ISTIOD", "VERSION", "SUBSCRIBED TYPES"},
		{"ratings-vm.bookinfo", "cluster-1", "embark-0", "1.31-dev", "2 (CDS,LDS)"},
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("proxy-status table = %q, want %q", rows, want)
	}
	if got := srv.requestTypes(); !slices.Equal(got, []string{synczType}) {
		t.Errorf("istioctl requested %q, want [%s]", got, synczType)
	}
}

// columns splits a tabwriter row: columns are at least two spaces apart.
var columns = regexp.MustCompile(`\s{2,}`)

// xdsServer is an upstream xDS server (go-control-plane with a snapshot cache)
// that records every stream pilot-agent opens.
type xdsServer struct {
	addr  string
	cache cachev3.SnapshotCache

	mu      sync.Mutex
	streams map[int64]*streamRecord
	opened  int
}

// streamRecord is what the server saw of one stream.
type streamRecord struct {
	id       int64
	seq      int // order of opening, from 0
	md       metadata.MD
	tls      bool
	node     *corev3.Node
	requests []*discoveryv3.DiscoveryRequest
	closed   bool
}

func startXDSServer(t *testing.T, creds credentials.TransportCredentials) *xdsServer {
	t.Helper()
	s := &xdsServer{
		cache:   cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		streams: map[int64]*streamRecord{},
	}
	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			p, _ := peer.FromContext(ctx)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.streams[id] = &streamRecord{
				id:  id,
				seq: s.opened,
				md:  md.Copy(),
				tls: p != nil && p.AuthInfo != nil && p.AuthInfo.AuthType() == "tls",
			}
			s.opened++
			return nil
		},
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			st := s.streams[id]
			if st.node == nil && req.GetNode() != nil {
				st.node = req.GetNode()
			}
			st.requests = append(st.requests, req)
			return nil
		},
		StreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.streams[id].closed = true
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, s.cache, callbacks))
	s.addr = serve(t, gs, cancel)
	return s
}

// serve runs gs on a loopback port until the test ends.
func serve(t *testing.T, gs *grpc.Server, stop func()) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	t.Cleanup(func() {
		stop()
		gs.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// publishCluster sets a snapshot with one EDS cluster for nodeID.
func (s *xdsServer) publishCluster(t *testing.T, nodeID, version, name string) {
	t.Helper()
	cluster := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}},
	}
	if err := cluster.Validate(); err != nil {
		t.Fatal(err)
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.ClusterType: {cluster}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(t.Context(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// waitStream polls until a stream satisfies ok and returns a copy of it.
func (s *xdsServer) waitStream(t *testing.T, what string, ok func(*streamRecord) bool) streamRecord {
	t.Helper()
	var found *streamRecord
	fixtures.Eventually(t, waitTimeout, what, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, st := range s.streams {
			if ok(st) {
				c := *st
				c.requests = append([]*discoveryv3.DiscoveryRequest(nil), st.requests...)
				found = &c
				return true
			}
		}
		return false
	})
	return *found
}

// synczServer answers istio.io/debug/syncz with fixed ClientConfigs, as istiod
// does for istioctl proxy-status.
type synczServer struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	addr    string
	cpID    string
	configs []*statusv3.ClientConfig

	mu    sync.Mutex
	types []string
}

func startSynczServer(t *testing.T, cpID string, configs ...*statusv3.ClientConfig) *synczServer {
	t.Helper()
	s := &synczServer{cpID: cpID, configs: configs}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s)
	s.addr = serve(t, gs, func() {})
	return s
}

func (s *synczServer) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for n := 1; ; n++ {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		s.mu.Lock()
		s.types = append(s.types, req.GetTypeUrl())
		s.mu.Unlock()
		if req.GetTypeUrl() != synczType {
			continue
		}
		resp := &discoveryv3.DiscoveryResponse{
			TypeUrl:      synczType,
			VersionInfo:  "1",
			Nonce:        strconv.Itoa(n),
			ControlPlane: &corev3.ControlPlane{Identifier: s.cpID},
		}
		for _, cc := range s.configs {
			a, err := anypb.New(cc)
			if err != nil {
				return err
			}
			resp.Resources = append(resp.Resources, a)
		}
		if err := stream.Send(resp); err != nil {
			return nil
		}
	}
}

func (s *synczServer) requestTypes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.types...)
}

// recvType receives responses until one of typeURL.
func recvType(t *testing.T, c *istioagent.Client, typeURL string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for {
		resp, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("waiting for a %s response: %v", typeURL, err)
		}
		if resp.GetTypeUrl() == typeURL {
			return resp
		}
	}
}

func clusterNames(t *testing.T, resp *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var names []string
	for _, r := range resp.GetResources() {
		c := &clusterv3.Cluster{}
		if err := r.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	return names
}

// serverTLS returns a CA (PEM) and a server certificate it signed for 127.0.0.1.
func serverTLS(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test xDS CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "embark-xds"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), cert
}
