package adsclient

import (
	"context"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// SotW is a State-of-the-World ADS stream.
type SotW struct {
	stream[*discovery.DiscoveryRequest, *discovery.DiscoveryResponse]
	raw      discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	names    map[string][]string // last requested, by type
	accepted map[string]string   // last ACKed version, by type
	nonces   map[string]string   // last ACKed or NACKed nonce, by type
}

// OpenSotW opens a SotW stream on conn presenting token (none if empty) as
// node; the stream ends with ctx or Close.
func OpenSotW(ctx context.Context, conn grpc.ClientConnInterface, token string, node *core.Node) (*SotW, error) {
	ctx, cancel := context.WithCancel(WithToken(ctx, token))
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open SotW stream: %w", err)
	}
	s := &SotW{raw: st, names: map[string][]string{}, accepted: map[string]string{}, nonces: map[string]string{}}
	s.stream = stream[*discovery.DiscoveryRequest, *discovery.DiscoveryResponse]{
		send: st.Send, setNode: func(r *discovery.DiscoveryRequest, n *core.Node) { r.Node = n },
		cancel: cancel, node: node, recv: receiver[*discovery.DiscoveryResponse]{recv: st.Recv},
	}
	return s, nil
}

// Request subscribes to names of typeURL (all of them when none), with the
// node on the stream's first request and, as Envoy changes a subscription,
// the last accepted version and last answered nonce of the type.
func (s *SotW) Request(typeURL string, names ...string) error {
	s.names[typeURL] = names
	return s.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names,
		VersionInfo: s.accepted[typeURL], ResponseNonce: s.nonces[typeURL]})
}

// ACK accepts resp: its type, version and nonce, and the names last
// requested of its type.
func (s *SotW) ACK(resp *discovery.DiscoveryResponse) error {
	s.accepted[resp.GetTypeUrl()] = resp.GetVersionInfo()
	s.nonces[resp.GetTypeUrl()] = resp.GetNonce()
	return s.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResourceNames: s.names[resp.GetTypeUrl()],
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
}

// NACK rejects resp with detail: its nonce, the last accepted version of
// its type and an INVALID_ARGUMENT error detail.
func (s *SotW) NACK(resp *discovery.DiscoveryResponse, detail string) error {
	s.nonces[resp.GetTypeUrl()] = resp.GetNonce()
	return s.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResourceNames: s.names[resp.GetTypeUrl()],
		VersionInfo: s.accepted[resp.GetTypeUrl()], ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: int32(codes.InvalidArgument), Message: detail}})
}

// Stream is the underlying gRPC stream, for tests that drive it themselves.
func (s *SotW) Stream() discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	return s.raw
}
