package istioagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// Client is a state-of-the-world ADS client on an agent's XDS socket: it plays
// the part of the Envoy that pilot-agent would run. Its stream makes
// pilot-agent open one upstream stream to the discovery address, to which it
// relays this client's requests and from which it relays the responses.
type Client struct {
	conn   *grpc.ClientConn
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
	node   *corev3.Node

	sendMu   sync.Mutex
	sentNode bool
	names    map[string][]string // last names sent per type URL

	responses chan *discoveryv3.DiscoveryResponse // closed when the stream ends
	closed    chan struct{}                       // closed by Close
	readDone  chan struct{}                       // closed when the reader exits
	err       error                               // the stream's end, set before responses is closed
	closeOnce sync.Once
}

// Connect opens an ADS stream on a's XDS socket. The first request carries the
// node pilot-agent generated (Agent.Node) without its GENERATOR metadata, which
// pilot-agent adds for proxyless gRPC only: Envoy's bootstrap has none. The
// stream lives until ctx ends or Close; the client is closed when the test ends.
func Connect(ctx context.Context, a *Agent) (*Client, error) {
	node, err := a.Node()
	if err != nil {
		return nil, err
	}
	return ConnectSocket(ctx, a.t, a.XDSSocket(), node)
}

// ConnectSocket is Connect for a pilot-agent this package did not start
// (e.g. one Istio's istio-start.sh runs in a simulated VM): socket is its
// XDS socket, node what its gRPC bootstrap holds (NodeFromGRPCBootstrap).
// GENERATOR is removed from the node's metadata, as Connect does.
func ConnectSocket(ctx context.Context, t testing.TB, socket string, node *corev3.Node) (*Client, error) {
	node = proto.Clone(node).(*corev3.Node)
	delete(node.GetMetadata().GetFields(), "GENERATOR")

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial pilot-agent's XDS socket: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("open ADS stream on pilot-agent's XDS socket: %w", err)
	}
	c := &Client{
		conn:      conn,
		stream:    stream,
		cancel:    cancel,
		node:      node,
		names:     map[string][]string{},
		responses: make(chan *discoveryv3.DiscoveryResponse, 64),
		closed:    make(chan struct{}),
		readDone:  make(chan struct{}),
	}
	go c.read()
	t.Cleanup(func() { _ = c.Close() })
	return c, nil
}

func (c *Client) read() {
	defer close(c.readDone)
	defer close(c.responses)
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.err = err
			return
		}
		select {
		case c.responses <- resp:
		case <-c.closed:
			c.err = errors.New("client closed")
			return
		}
	}
}

// Node returns the node the client sends.
func (c *Client) Node() *corev3.Node { return proto.Clone(c.node).(*corev3.Node) }

// Send sends a request for typeURL and names (none: a wildcard subscription).
// version and nonce are empty on a first request; an ACK repeats those of the
// response (see ACK).
func (c *Client) Send(typeURL string, names []string, version, nonce string) error {
	return c.SendRequest(&discoveryv3.DiscoveryRequest{
		TypeUrl:       typeURL,
		ResourceNames: names,
		VersionInfo:   version,
		ResponseNonce: nonce,
	})
}

// SendRequest sends req as is, with the node added to the stream's first request.
func (c *Client) SendRequest(req *discoveryv3.DiscoveryRequest) error {
	req = proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if !c.sentNode {
		req.Node = c.node
	}
	if err := c.stream.Send(req); err != nil {
		return fmt.Errorf("send %s request: %w", req.GetTypeUrl(), err)
	}
	c.sentNode = true
	c.names[req.GetTypeUrl()] = req.GetResourceNames()
	return nil
}

// ACK acknowledges resp, keeping the names last requested for its type.
func (c *Client) ACK(resp *discoveryv3.DiscoveryResponse) error {
	return c.Send(resp.GetTypeUrl(), c.lastNames(resp.GetTypeUrl()), resp.GetVersionInfo(), resp.GetNonce())
}

// NACK rejects resp with message; the version stays the last one accepted,
// given as version.
func (c *Client) NACK(resp *discoveryv3.DiscoveryResponse, version, message string) error {
	return c.SendRequest(&discoveryv3.DiscoveryRequest{
		TypeUrl:       resp.GetTypeUrl(),
		ResourceNames: c.lastNames(resp.GetTypeUrl()),
		VersionInfo:   version,
		ResponseNonce: resp.GetNonce(),
		ErrorDetail:   &status.Status{Code: int32(codes.InvalidArgument), Message: message},
	})
}

func (c *Client) lastNames(typeURL string) []string {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.names[typeURL]
}

// Recv returns the next response, or the error that ended the stream once every
// response before it was returned, or ctx's error.
func (c *Client) Recv(ctx context.Context) (*discoveryv3.DiscoveryResponse, error) {
	select {
	case resp, ok := <-c.responses:
		if !ok {
			return nil, c.err
		}
		return resp, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close ends the stream and the connection and waits for the client's reader.
// It may be called more than once.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		c.cancel()
		err = c.conn.Close()
		<-c.readDone
	})
	return err
}
