package cacerts

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/embark-mesh/embark/test/istioagent"
)

// sdsSecret is what Envoy holds of one SDS secret: pilot-agent's last push
// of it on a stream of its own, ACKed as Envoy does. pilot-agent renews a
// workload certificate only while Envoy watches it over SDS.
type sdsSecret struct {
	mu     sync.Mutex
	secret *tlsv3.Secret
	err    error
}

// watchSDS opens an SDS stream for name on pilot-agent's socket, as Envoy
// does, and keeps the last secret pushed until the test ends.
func watchSDS(t *testing.T, agent *istioagent.Agent, node *core.Node, name string) *sdsSecret {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+agent.SDSSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	t.Cleanup(cancel)
	var st secretv3.SecretDiscoveryService_StreamSecretsClient
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		if _, err := os.Stat(agent.SDSSocket()); err != nil {
			return false, nil
		}
		st, err = secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no SDS socket at %s: %v\npilot-agent log:\n%s", agent.SDSSocket(), err, tail(agent.Logs()))
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	s := &sdsSecret{}
	go s.receive(st, name)
	return s
}

func (s *sdsSecret) receive(st secretv3.SecretDiscoveryService_StreamSecretsClient, name string) {
	for {
		resp, err := st.Recv()
		if err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			return
		}
		for _, a := range resp.GetResources() {
			sec := &tlsv3.Secret{}
			if err := a.UnmarshalTo(sec); err != nil || sec.GetName() != name {
				continue
			}
			s.mu.Lock()
			s.secret = sec
			s.mu.Unlock()
		}
		_ = st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{name}, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
}

// last returns the last secret pushed (nil before the first) and the
// stream's error once it ended.
func (s *sdsSecret) last() (*tlsv3.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.secret, s.err
}
