package adsclient

import (
	"context"
	"fmt"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Delta is a Delta (incremental) ADS stream.
type Delta struct {
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	cancel context.CancelFunc
	node   *core.Node
	recv   receiver[*discovery.DeltaDiscoveryResponse]
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
	d := &Delta{stream: st, cancel: cancel, node: node}
	d.recv.recv = st.Recv
	return d, nil
}

// Subscribe subscribes to names of typeURL (to all of them when none, as a
// wildcard subscription), with the node on the stream's first request.
func (d *Delta) Subscribe(typeURL string, names ...string) error {
	return d.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names})
}

// Recv returns the next response, or an error wrapping ErrTimeout after
// timeout (DefaultTimeout when zero).
func (d *Delta) Recv(timeout time.Duration) (*discovery.DeltaDiscoveryResponse, error) {
	return d.recv.next(timeout)
}

// Next returns the next response, waiting as long as the stream lives: for
// a reader that runs beside the test.
func (d *Delta) Next() (*discovery.DeltaDiscoveryResponse, error) {
	return d.recv.next(-1)
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

// Send sends req as it is, adding the node when it is the stream's first
// request and req has none.
func (d *Delta) Send(req *discovery.DeltaDiscoveryRequest) error {
	if d.node != nil && req.GetNode() == nil {
		req.Node = d.node
	}
	d.node = nil
	return d.stream.Send(req)
}

// Wait receives until the stream ends and returns why (never nil: io.EOF
// when the server closed it cleanly).
func (d *Delta) Wait() error {
	return d.recv.drain()
}

// Stream is the underlying gRPC stream, for tests that drive it themselves.
func (d *Delta) Stream() discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	return d.stream
}

// Close cancels the stream, as a sidecar's stream ends when its connection
// goes: the server sees the cancellation, not a half-close.
func (d *Delta) Close() { d.cancel() }
