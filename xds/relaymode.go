package xds

import (
	"context"
	"strings"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/embark-mesh/embark/xds/relay"
)

// relayed runs an admitted workload stream in istiod mode: the server keeps
// authentication, liveness (the stream counts as the workload's connection
// exactly as in standalone mode), health reports and its own syncz
// bookkeeping; every other request goes to istiod through s.opts.Relay.
func relayed[Req, Resp any](s *Server, bs *boundStream[Req, Resp], st *stream,
	run func(authorization string, hooks relay.Hooks[Req, Resp]) error,
	info func(*Req) requestInfo, sent func(*Resp) (typeURL, nonce, version string),
) error {
	ref := streamRef{relayedStream, s.relayIDs.Add(1)}
	s.opened(ref, st)
	defer s.unbind(ref)
	token, err := bearerToken(bs.ctx)
	if err != nil {
		return status.Errorf(codes.Unauthenticated, "%v", err)
	}
	return run(relayAuthorization(bs.ctx, token), relay.Hooks[Req, Resp]{
		Request: func(req *Req) (bool, error) {
			ri := info(req)
			track, err := s.checkType(st, ri.typeURL, ri.errorDetail)
			if err != nil || !track {
				return false, err
			}
			if version, nack := st.requested(ri.typeURL, ri.nonce, ri.errorDetail != nil, s.opts.Clock()); nack {
				s.nacked(st, ri.typeURL, version, ri.errorDetail)
			}
			return true, nil
		},
		Response: func(resp *Resp) {
			t, n, v := sent(resp)
			st.sent(t, n, v, s.opts.Clock())
		},
		Stop: st.kill,
	})
}

func (s *Server) relaySotW(bs *boundStream[discovery.DiscoveryRequest, discovery.DiscoveryResponse], st *stream) error {
	return relayed(s, bs, st, func(authorization string, h relay.Hooks[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
		return s.opts.Relay.SotW(bs.ctx, bs, authorization, h)
	}, func(r *discovery.DiscoveryRequest) requestInfo {
		return requestInfo{r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail()}
	}, func(r *discovery.DiscoveryResponse) (string, string, string) {
		return r.GetTypeUrl(), r.GetNonce(), r.GetVersionInfo()
	})
}

func (s *Server) relayDelta(bs *boundStream[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse], st *stream) error {
	return relayed(s, bs, st, func(authorization string, h relay.Hooks[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]) error {
		return s.opts.Relay.Delta(bs.ctx, bs, authorization, h)
	}, func(r *discovery.DeltaDiscoveryRequest) requestInfo {
		return requestInfo{r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail()}
	}, func(r *discovery.DeltaDiscoveryResponse) (string, string, string) {
		return r.GetTypeUrl(), r.GetNonce(), r.GetSystemVersionInfo()
	})
}

// requestInfo is what the server reads of a request, SotW or Delta.
type requestInfo struct {
	typeURL     string
	nonce       string
	errorDetail *rpcstatus.Status
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
