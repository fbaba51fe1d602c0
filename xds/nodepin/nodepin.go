// Package nodepin pins an xDS stream to the node of its first request, so
// that no later request on the stream can speak for another node.
package nodepin

import (
	"bytes"
	"errors"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

// Guard pins a stream to the node of its first request.
//
// go-control-plane adopts the node of any later request that carries one
// (sotw/v3 and delta/v3: "if req.GetNode() != nil { node = req.GetNode() }")
// and keys its snapshot cache by that node's ID, so a stream authorized as
// workload A could ask with B's node ID and be served B's configuration, and
// every invented node ID would leave a status entry in the cache. The guard
// runs in boundStream.Recv, before go-control-plane, the relay or the
// callbacks see a request, so no request of any type (HealthInformation and
// syncz included) reaches them with another node. The zero Guard pins the
// first request it checks; a Guard serves one stream's single reader.
//
// The guard keeps the first node in its wire form (deterministic encoding)
// and its ID, not the decoded message: a sidecar's node metadata is several
// KiB in memory per stream, its encoding a fraction of that.
type Guard struct {
	pinned bool
	id     string // the first node's ID
	has    bool   // the first request carried a node
	wire   []byte // the first node, deterministically encoded
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// Pin pins n (nil: a stream whose first request carried no node).
func (g *Guard) Pin(n *core.Node) {
	g.pinned, g.id, g.has = true, n.GetId(), n != nil
	if n != nil {
		// A node that does not encode cannot have come off the wire.
		g.wire, _ = deterministic.Marshal(n)
	}
}

// ErrSwitched is what Check's errors wrap: the stream must end
// (PermissionDenied at the gRPC boundary).
var ErrSwitched = errors.New("a stream serves one node; open a new stream")

// Check returns why req must end the stream, wrapping ErrSwitched: it carries
// a node that is not exactly the stream's first node. A request without a
// node always passes.
func (g *Guard) Check(req any) error {
	n := RequestNode(req)
	if !g.pinned {
		g.Pin(n)
		return nil
	}
	if n == nil {
		return nil
	}
	if wire, err := deterministic.Marshal(n); err == nil && g.has && bytes.Equal(wire, g.wire) {
		return nil
	}
	if n.GetId() != g.id {
		return fmt.Errorf("a request carries node ID %.256q, the stream was opened as %.256q: %w", n.GetId(), g.id, ErrSwitched)
	}
	return fmt.Errorf("a request carries another node (cluster, metadata or locality) than the stream's first request for node ID %.256q: %w", n.GetId(), ErrSwitched)
}

// RequestNode is the node of a SotW or Delta request.
func RequestNode(req any) *core.Node {
	switch r := req.(type) {
	case *discovery.DiscoveryRequest:
		return r.GetNode()
	case *discovery.DeltaDiscoveryRequest:
		return r.GetNode()
	default:
		return nil // not an xDS request: the stream's types are only these two
	}
}
