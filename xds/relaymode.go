package xds

import (
	"context"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/tokenauth"
)

// relayed runs an admitted workload stream in istiod mode: the server keeps
// authentication, liveness (the stream counts as the workload's connection
// exactly as in standalone mode), health reports and its own syncz
// bookkeeping; every other request goes to istiod through s.opts.Relay.
func relayed[Req, Resp any](s *Server, p *protocol[Req, Resp], bs *boundStream[Req, Resp], st *stream) error {
	s.relayed.Add(1)
	s.opened(st)
	defer s.closed(st)
	token, err := tokenauth.BearerToken(bs.Context())
	if err != nil {
		return status.Errorf(codes.Unauthenticated, "%v", err)
	}
	hooks := relay.Hooks[Req, Resp]{
		Request:  func(req *Req) (bool, error) { return s.request(st, p.request(req), nil) },
		Response: func(resp *Resp) { s.responded(st, p.response(resp)) },
		Stop:     st.ctx.Done(),
		Node:     st.relayNode,
	}
	if sel := s.opts.Revisions; sel != nil {
		w := st.proxy.Workload
		hooks.Revision = func() (string, <-chan struct{}) { return sel.Revision(st.ctx, w.Key, w.Group) }
	}
	return p.relay(s.opts.Relay, bs, relayAuthorization(bs.Context(), token), hooks)
}

// relayNode hands the relay, once, the node built for istiod at admission
// (Server.istiodNode) in place of the sidecar's, and forgets it: the relay
// keeps it encoded.
func (st *stream) relayNode(*core.Node) (*core.Node, error) {
	n := st.upstream
	st.upstream = nil
	if n == nil {
		return nil, status.Error(codes.Internal, "no node was built for istiod at admission")
	}
	return n, nil
}

// relayAuthorization is the authorization header sent to istiod: the
// sidecar's own when it is already "Bearer <token>" (the stream then holds
// one copy of the token, not two), else that form.
func relayAuthorization(ctx context.Context, token string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		if rest, ok := strings.CutPrefix(vals[0], "Bearer "); ok && rest == token {
			return vals[0]
		}
	}
	return "Bearer " + token
}
