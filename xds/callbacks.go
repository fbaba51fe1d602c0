package xds

import (
	"context"
	"errors"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// streamRef names a stream in the server's map. go-control-plane numbers
// SotW and Delta streams each from 1 (two counters), so its ID alone names
// two streams when both protocols are in use; relayed streams, which
// go-control-plane never sees, are numbered by the connection tracker.
type streamRef struct {
	kind streamKind
	id   int64
}

type streamKind uint8

const (
	sotwStream streamKind = iota
	deltaStream
	relayedStream
)

// callbacks are the server's hooks into go-control-plane (standalone mode
// and debug streams): none of them is part of the server's API.
func (s *Server) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamOpenFunc:        func(ctx context.Context, id int64, _ string) error { return s.bind(ctx, sotwStream, id) },
		StreamClosedFunc:      func(id int64, _ *core.Node) { s.unbind(streamRef{sotwStream, id}) },
		DeltaStreamOpenFunc:   func(ctx context.Context, id int64, _ string) error { return s.bind(ctx, deltaStream, id) },
		DeltaStreamClosedFunc: func(id int64, _ *core.Node) { s.unbind(streamRef{deltaStream, id}) },
		StreamRequestFunc:     func(id int64, req *discovery.DiscoveryRequest) error { return onRequest(s, sotw, id, req) },
		StreamResponseFunc: func(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			onResponse(s, sotw, id, resp)
		},
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error { return onRequest(s, delta, id, req) },
		StreamDeltaResponseFunc: func(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
			onResponse(s, delta, id, resp)
		},
		// Only streams are served.
		FetchRequestFunc: func(context.Context, *discovery.DiscoveryRequest) error {
			return status.Error(codes.Unimplemented, "REST fetch is not served")
		},
	}
}

// bind makes the stream of ctx known by go-control-plane's ID of kind.
func (s *Server) bind(ctx context.Context, kind streamKind, id int64) error {
	st := streamFrom(ctx)
	if st == nil {
		return status.Error(codes.Internal, "stream without binding")
	}
	s.opened(streamRef{kind, id}, st)
	return nil
}

// opened records an open stream and, for a workload's sidecar, tells the
// registry under an ID unique in the connection tracker.
func (s *Server) opened(ref streamRef, st *stream) {
	st.opened = s.opts.Clock()
	if st.counted {
		st.connID = s.opts.Connections.NewStreamID()
	}
	s.mu.Lock()
	s.streams[ref] = st
	s.mu.Unlock()
	if st.counted {
		s.opts.Connections.Opened(st.proxy.Workload, st.connID)
	}
}

// unbind forgets a closed stream and tells the registry.
func (s *Server) unbind(ref streamRef) {
	s.mu.Lock()
	st := s.streams[ref]
	delete(s.streams, ref)
	s.mu.Unlock()
	if st != nil && st.counted {
		s.opts.Connections.Closed(st.proxy.Workload, st.connID)
	}
}

func (s *Server) stream(ref streamRef) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[ref]
}

// checkType decides what a request of typeURL on st means: an error ends the
// stream; health reports are passed on and never subscribe.
func (s *Server) checkType(st *stream, typeURL string, errorDetail *rpcstatus.Status) (track bool, err error) {
	isDebug := strings.HasPrefix(typeURL, debugTypePrefix)
	switch {
	case st == nil:
		return false, status.Error(codes.Internal, "unknown stream")
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
// last version the proxy accepted) by the rejected version before
// go-control-plane's cache sees it, so the cache answers when the type's
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
	if st != nil && !st.debug {
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

// Fetch implements cache.ConfigFetcher; REST is not served.
func (w *watcher) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("fetch is not served")
}
