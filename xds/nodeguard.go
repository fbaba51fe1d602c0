package xds

import (
	"bytes"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// nodeGuard pins a stream to the node of its first request.
//
// go-control-plane adopts the node of any later request that carries one
// (sotw/v3 and delta/v3: "if req.GetNode() != nil { node = req.GetNode() }")
// and keys its snapshot cache by that node's ID, so a stream authorized as
// workload A could ask with B's node ID and be served B's configuration, and
// every invented node ID would leave a status entry in the cache. The guard
// runs in boundStream.Recv, before go-control-plane, the relay or the
// callbacks see a request, so no request of any type (HealthInformation and
// syncz included) reaches them with another node. The zero guard pins the
// first request it checks.
//
// The guard keeps the first node in its wire form (deterministic encoding)
// and its ID, not the decoded message: a sidecar's node metadata is several
// KiB in memory per stream, its encoding a fraction of that.
type nodeGuard struct {
	pinned bool
	id     string // the first node's ID
	has    bool   // the first request carried a node
	wire   []byte // the first node, deterministically encoded
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// newNodeGuard pins the node of first; with first nil (debug streams, whose
// first request the handler reads) the first request checked pins it.
func newNodeGuard(first any) *nodeGuard {
	g := &nodeGuard{}
	if first != nil {
		g.pin(requestNode(first))
	}
	return g
}

func (g *nodeGuard) pin(n *core.Node) {
	g.pinned, g.id, g.has = true, n.GetId(), n != nil
	if n != nil {
		// A node that does not encode cannot have come off the wire.
		g.wire, _ = deterministic.Marshal(n)
	}
}

// check returns why req must end the stream: it carries a node that is not
// exactly the stream's first node. A request without a node always passes.
func (g *nodeGuard) check(req any) *refusal {
	n := requestNode(req)
	if !g.pinned {
		g.pin(n)
		return nil
	}
	if n == nil {
		return nil
	}
	if wire, err := deterministic.Marshal(n); err == nil && g.has && bytes.Equal(wire, g.wire) {
		return nil
	}
	if n.GetId() != g.id {
		return &refusal{code: codes.PermissionDenied, reason: closeNodeSwitched, msg: fmt.Sprintf(
			"a request carries node ID %.256q, the stream was opened as %.256q: a stream serves one node; open a new stream", n.GetId(), g.id)}
	}
	return &refusal{code: codes.PermissionDenied, reason: closeNodeSwitched, msg: fmt.Sprintf(
		"a request carries another node (cluster, metadata or locality) than the stream's first request for node ID %.256q: a stream serves one node; open a new stream", n.GetId())}
}

// requestNode is the node of a SotW or Delta request.
func requestNode(req any) *core.Node {
	switch r := req.(type) {
	case *discovery.DiscoveryRequest:
		return r.GetNode()
	case *discovery.DeltaDiscoveryRequest:
		return r.GetNode()
	default:
		return nil // not an xDS request: the stream's types are only these two
	}
}
