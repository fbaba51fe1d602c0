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

// Delta is a Delta (incremental) ADS stream.
type Delta struct {
	stream[*discovery.DeltaDiscoveryRequest, *discovery.DeltaDiscoveryResponse]
	raw discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

// OpenDelta opens a Delta stream on conn presenting token (none if empty)
// as node; the stream ends with ctx or Close.
func OpenDelta(ctx context.Context, conn grpc.ClientConnInterface, token string, node *core.Node) (*Delta, error) {
	ctx, cancel := context.WithCancel(WithToken(ctx, token))
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open Delta stream: %w", err)
	}
	d := &Delta{raw: st}
	d.stream = stream[*discovery.DeltaDiscoveryRequest, *discovery.DeltaDiscoveryResponse]{
		send: st.Send, setNode: func(r *discovery.DeltaDiscoveryRequest, n *core.Node) { r.Node = n },
		cancel: cancel, node: node, recv: receiver[*discovery.DeltaDiscoveryResponse]{recv: st.Recv},
	}
	return d, nil
}

// Subscribe subscribes to names of typeURL (to all of them when none, as a
// wildcard subscription), with the node on the stream's first request.
func (d *Delta) Subscribe(typeURL string, names ...string) error {
	return d.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names})
}

// ACK accepts resp: its type and nonce.
func (d *Delta) ACK(resp *discovery.DeltaDiscoveryResponse) error {
	return d.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
}

// NACK rejects resp with detail: its type, nonce and an INVALID_ARGUMENT
// error detail.
func (d *Delta) NACK(resp *discovery.DeltaDiscoveryResponse, detail string) error {
	return d.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: int32(codes.InvalidArgument), Message: detail}})
}

// Stream is the underlying gRPC stream, for tests that drive it themselves.
func (d *Delta) Stream() discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	return d.raw
}
