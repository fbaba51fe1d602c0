package xds

import (
	"context"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// hooks are the server's callbacks from go-control-plane for one stream
// (standalone mode and debug streams). go-control-plane serves each stream
// with a handler of its own (see protocol.serve) whose context is the
// stream's, so that closing the stream ends the handler without a goroutine
// between the client and go-control-plane; the stream IDs it passes are
// therefore all 1 and unused.
type hooks struct {
	s  *Server
	st *stream
}

// OnStreamOpen implements sotwv3.Callbacks.
func (h hooks) OnStreamOpen(context.Context, int64, string) error { h.s.opened(h.st); return nil }

// OnStreamClosed implements sotwv3.Callbacks.
func (h hooks) OnStreamClosed(int64, *core.Node) { h.s.closed(h.st) }

// OnStreamRequest implements sotwv3.Callbacks.
func (h hooks) OnStreamRequest(_ int64, req *discovery.DiscoveryRequest) error {
	return onRequest(h.s, sotw, h.st, req)
}

// OnStreamResponse implements sotwv3.Callbacks.
func (h hooks) OnStreamResponse(_ context.Context, _ int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	h.s.responded(h.st, sotw.response(resp))
}

// OnDeltaStreamOpen implements deltav3.Callbacks.
func (h hooks) OnDeltaStreamOpen(context.Context, int64, string) error { h.s.opened(h.st); return nil }

// OnDeltaStreamClosed implements deltav3.Callbacks.
func (h hooks) OnDeltaStreamClosed(int64, *core.Node) { h.s.closed(h.st) }

// OnStreamDeltaRequest implements deltav3.Callbacks.
func (h hooks) OnStreamDeltaRequest(_ int64, req *discovery.DeltaDiscoveryRequest) error {
	return onRequest(h.s, delta, h.st, req)
}

// OnStreamDeltaResponse implements deltav3.Callbacks.
func (h hooks) OnStreamDeltaResponse(_ int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	h.s.responded(h.st, delta.response(resp))
}

// opened records an open stream and, for a workload's sidecar, tells the
// registry under an ID unique in the connection tracker.
func (s *Server) opened(st *stream) {
	st.opened = s.opts.Clock()
	if st.counted {
		st.connID = s.opts.Connections.NewStreamID()
	}
	s.mu.Lock()
	s.open++
	s.mu.Unlock()
	if st.counted {
		s.opts.Connections.Opened(st.proxy.Workload, st.connID)
	}
}

// closed forgets a closed stream and tells the registry.
func (s *Server) closed(st *stream) {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
	if st.counted {
		s.opts.Connections.Closed(st.proxy.Workload, st.connID)
	}
}

// checkType decides what a request of typeURL on st means: an error ends the
// stream; health reports are passed on and never subscribe.
func (s *Server) checkType(st *stream, typeURL string, errorDetail *rpcstatus.Status) (track bool, err error) {
	isDebug := strings.HasPrefix(typeURL, debugTypePrefix)
	switch {
	case st.debug && typeURL != TypeSyncz:
		return false, status.Errorf(codes.PermissionDenied, "the debug listener serves only %s", TypeSyncz)
	case st.debug:
		return false, nil
	case isDebug:
		return false, status.Errorf(codes.PermissionDenied, "debug type %s is served only on the loopback debug listener", typeURL)
	case !slices.Contains(WorkloadTypes, typeURL):
		return false, status.Errorf(codes.InvalidArgument, "type URL %.256q is not served: a workload stream asks only for %s", typeURL, strings.Join(WorkloadTypes, ", "))
	case typeURL == TypeHealthInformation:
		h := Health{Healthy: errorDetail == nil, At: s.opts.Clock()}
		if errorDetail != nil {
			h.Message = errorDetail.GetMessage()
		}
		s.opts.Health.ReportHealth(s.ctx, st.proxy.Workload, h)
		return false, nil
	default:
		return true, nil
	}
}

// request handles a request of st: it ends the stream (error), passes on a
// health report or debug request (track false), or records an ACK or a
// NACK (track true).
//
// A NACK of the latest response holds the configuration: hold, when given
// (SotW under go-control-plane), replaces the request's version_info (the
// last version the proxy accepted) by the rejected version before the
// snapshot cache (snapcache) sees it, so the cache answers when the type's
// version changes rather than at once with the same rejected resources
// again (which would loop).
func (s *Server) request(st *stream, ri requestInfo, hold func(version string)) (track bool, err error) {
	track, err = s.checkType(st, ri.typeURL, ri.errorDetail)
	if err != nil || !track {
		return false, err
	}
	if version, nack := st.requested(ri.typeURL, ri.nonce, ri.errorDetail != nil, s.opts.Clock()); nack {
		s.nacked(st, ri.typeURL, version, ri.errorDetail)
		if hold != nil {
			hold(version)
		}
	}
	return true, nil
}

// responded records what was sent on st.
func (s *Server) responded(st *stream, ri responseInfo) {
	if !st.debug {
		st.sent(ri.typeURL, ri.nonce, ri.version, s.opts.Clock())
	}
}

// watcher routes go-control-plane's watches: syncz is answered from the
// server's streams, health reports open no watch, the rest comes from the
// per-node snapshots.
type watcher struct{ s *Server }

func noop() {}

// CreateWatch implements cache.ConfigWatcher.
func (w *watcher) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	switch t := req.GetTypeUrl(); {
	case t == TypeSyncz:
		// Answer the stream's first syncz request only: the subscription
		// remembers that it was answered, so ACKs are not answered again
		// (which would loop). Clients send a nonce even on a first request
		// (istioctl does), so the nonce cannot tell.
		if len(sub.ReturnedResources()) == 0 {
			resp := w.s.syncz()
			out <- &cache.PassthroughResponse{Request: req, DiscoveryResponse: resp, ReturnedResources: map[string]string{TypeSyncz: resp.GetVersionInfo()}}
		}
		return noop, nil
	case t == TypeHealthInformation || strings.HasPrefix(t, debugTypePrefix):
		return noop, nil
	default:
		return w.s.snapshots.CreateWatch(req, sub, out)
	}
}

// CreateDeltaWatch implements cache.ConfigWatcher.
func (w *watcher) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	if t := req.GetTypeUrl(); t == TypeHealthInformation || strings.HasPrefix(t, debugTypePrefix) {
		return noop, nil
	}
	return w.s.snapshots.CreateDeltaWatch(req, sub, out)
}
