package xds

import (
	"context"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	deltav3 "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/embark-mesh/embark/xds/relay"
)

// protocol is what differs between the two xDS variants, SotW and Delta:
// how the server reads their requests and responses, and which handler of
// go-control-plane and of the relay serves them. Everything else (admission,
// binding, ACK and NACK bookkeeping, health reports, liveness) is one
// generic path over it.
type protocol[Req, Resp any] struct {
	request  func(*Req) requestInfo
	response func(*Resp) responseInfo
	// hold replaces a SotW request's version_info by the version the proxy
	// rejected (see Server.request); nil for Delta.
	hold func(req *Req, version string)
	// serve runs go-control-plane's handler (standalone mode and debug)
	// until the client ends the stream or ctx ends, with a go-control-plane
	// server of the stream's own (a small struct) whose context is ctx:
	// go-control-plane's handler ends when its server's context does.
	serve func(ctx context.Context, w cache.ConfigWatcher, cb hooks, bs *boundStream[Req, Resp]) error
	// relay is the relay's handler (istiod mode).
	relay func(r *relay.Relay, bs *boundStream[Req, Resp], authorization string, h relay.Hooks[Req, Resp]) error
	// subscriptions tracks a standalone stream's subscriptions within the
	// limits the relay applies to its own (go-control-plane keeps every
	// name a Delta stream subscribes to, without bound).
	subscriptions func(l relay.Limits, total *atomic.Int64) relay.Subscriptions[Req]
}

// requestInfo is what the server reads of a request, SotW or Delta.
type requestInfo struct {
	node        *core.Node
	typeURL     string
	nonce       string
	errorDetail *rpcstatus.Status
}

// responseInfo is what the server records of a response, SotW or Delta.
type responseInfo struct {
	typeURL, nonce, version string
}

var sotw = &protocol[discovery.DiscoveryRequest, discovery.DiscoveryResponse]{
	request: func(r *discovery.DiscoveryRequest) requestInfo {
		return requestInfo{r.GetNode(), r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail()}
	},
	response: func(r *discovery.DiscoveryResponse) responseInfo {
		return responseInfo{r.GetTypeUrl(), r.GetNonce(), r.GetVersionInfo()}
	},
	hold: func(r *discovery.DiscoveryRequest, version string) { r.VersionInfo = version },
	serve: func(ctx context.Context, w cache.ConfigWatcher, cb hooks, bs *boundStream[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
		return sotwv3.NewServer(ctx, w, cb).StreamHandler(bs, resource.AnyType)
	},
	relay: func(r *relay.Relay, bs *boundStream[discovery.DiscoveryRequest, discovery.DiscoveryResponse], authorization string, h relay.Hooks[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
		return r.SotW(bs.Context(), bs, authorization, h)
	},
	subscriptions: relay.NewSotwSubscriptions,
}

var delta = &protocol[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]{
	request: func(r *discovery.DeltaDiscoveryRequest) requestInfo {
		return requestInfo{r.GetNode(), r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail()}
	},
	response: func(r *discovery.DeltaDiscoveryResponse) responseInfo {
		return responseInfo{r.GetTypeUrl(), r.GetNonce(), r.GetSystemVersionInfo()}
	},
	serve: func(ctx context.Context, w cache.ConfigWatcher, cb hooks, bs *boundStream[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]) error {
		return deltav3.NewServer(ctx, w, cb).DeltaStreamHandler(bs, resource.AnyType)
	},
	relay: func(r *relay.Relay, bs *boundStream[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse], authorization string, h relay.Hooks[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]) error {
		return r.Delta(bs.Context(), bs, authorization, h)
	},
	subscriptions: relay.NewDeltaSubscriptions,
}

// onRequest is go-control-plane's request callback of protocol p.
func onRequest[Req, Resp any](s *Server, p *protocol[Req, Resp], st *stream, req *Req) error {
	var hold func(string)
	if p.hold != nil {
		hold = func(version string) { p.hold(req, version) }
	}
	_, err := s.request(st, p.request(req), hold)
	return err
}
