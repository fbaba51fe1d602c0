package xds

import (
	"context"
	"errors"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
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

// OnStreamOpen binds go-control-plane's SotW stream ID to the server's
// stream and tells the registry that a workload's stream opened.
func (s *Server) OnStreamOpen(ctx context.Context, id int64, _ string) error {
	return s.bind(ctx, sotwStream, id)
}

// OnStreamClosed tells the registry that a workload's SotW stream closed.
func (s *Server) OnStreamClosed(id int64, _ *core.Node) { s.unbind(streamRef{sotwStream, id}) }

// OnDeltaStreamOpen is OnStreamOpen for Delta streams.
func (s *Server) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	return s.bind(ctx, deltaStream, id)
}

// OnDeltaStreamClosed is OnStreamClosed for Delta streams.
func (s *Server) OnDeltaStreamClosed(id int64, _ *core.Node) { s.unbind(streamRef{deltaStream, id}) }

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

// OnStreamRequest tracks ACKs and handles health reports and debug types.
//
// A NACK of the latest response holds the configuration: the request's
// version_info (the last version the proxy accepted) is replaced by the
// rejected version before go-control-plane's cache sees it, so the cache
// answers when the type's version changes rather than at once with the same
// rejected resources again (which would loop).
func (s *Server) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	st := s.stream(streamRef{sotwStream, id})
	track, err := s.checkType(st, req.GetTypeUrl(), req.GetErrorDetail())
	if err != nil || !track {
		return err
	}
	if version, nack := st.requested(req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail() != nil, s.opts.Clock()); nack {
		s.nacked(st, req.GetTypeUrl(), version, req.GetErrorDetail())
		req.VersionInfo = version
	}
	return nil
}

// OnStreamResponse records what was sent.
func (s *Server) OnStreamResponse(_ context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	if st := s.stream(streamRef{sotwStream, id}); st != nil && !st.debug {
		st.sent(resp.GetTypeUrl(), resp.GetNonce(), resp.GetVersionInfo(), s.opts.Clock())
	}
}

// OnStreamDeltaRequest is OnStreamRequest for Delta streams.
func (s *Server) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	st := s.stream(streamRef{deltaStream, id})
	track, err := s.checkType(st, req.GetTypeUrl(), req.GetErrorDetail())
	if err != nil || !track {
		return err
	}
	if version, nack := st.requested(req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail() != nil, s.opts.Clock()); nack {
		s.nacked(st, req.GetTypeUrl(), version, req.GetErrorDetail())
	}
	return nil
}

// OnStreamDeltaResponse is OnStreamResponse for Delta streams.
func (s *Server) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	if st := s.stream(streamRef{deltaStream, id}); st != nil && !st.debug {
		st.sent(resp.GetTypeUrl(), resp.GetNonce(), resp.GetSystemVersionInfo(), s.opts.Clock())
	}
}

// OnFetchRequest refuses REST fetches: only streams are served.
func (s *Server) OnFetchRequest(context.Context, *discovery.DiscoveryRequest) error {
	return status.Error(codes.Unimplemented, "REST fetch is not served")
}

// OnFetchResponse implements serverv3.Callbacks.
func (s *Server) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

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
