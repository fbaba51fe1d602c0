package cacerts

import (
	"context"
	"sync"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
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
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	t.Cleanup(cancel)
	st := meshkit.OpenSDS(t, ctx, agent, node, name)
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
