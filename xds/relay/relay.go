package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Options configures a Relay. Every field documents its default.
type Options struct {
	// Conn reaches istiod's secure xDS port (TLS verified with istiod's
	// roots); it is shared by every relayed stream, each of which carries
	// its sidecar's token. Required.
	Conn grpc.ClientConnInterface
	// MinBackoff is the wait before the first reconnect after an upstream
	// stream failed; it doubles (with jitter) up to MaxBackoff while
	// reconnects fail, and starts again once istiod answers. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the wait between reconnects. Default 10s.
	MaxBackoff time.Duration
	// Limits bound what one stream may subscribe to; a request over them
	// ends the stream ResourceExhausted. Default: see Limits.
	Limits Limits
	// MaxRequestBytes bounds each request the relay builds to restore a
	// Delta stream's subscriptions on a new upstream stream: istiod's limit
	// on a received message. Default DefaultMaxRequestBytes (4 MiB).
	MaxRequestBytes int
	// Revision is the Istio revision of the istiod Conn reaches, the
	// istiod_revision label of the relay's metrics. Default "default".
	Revision string
	// Revisions reach the istiods of other revisions, by revision name
	// (one Embark serving a canary istiod beside the default one): a
	// stream is relayed to the one its Hooks.Revision names. Default: none.
	Revisions map[string]grpc.ClientConnInterface
	// Metrics. Default: not recorded.
	Metrics *Metrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.Conn == nil {
		return errors.New("relay: Conn is required")
	}
	for rev, c := range o.Revisions {
		if rev == "" || rev == o.Revision || c == nil {
			return fmt.Errorf("relay: revision %q: a name other than the default revision's and a connection are required", rev)
		}
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 10 * time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	o.Limits.setDefaults()
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Relay relays sidecar ADS streams to istiod.
type Relay struct {
	opts  Options
	log   *slog.Logger
	ups   map[string]upstreamOf // by revision; "" is Conn's
	names atomic.Int64          // resource names the open streams subscribe to
}

// upstreamOf is one revision's istiod: its ADS client and metrics.
type upstreamOf struct {
	ads discovery.AggregatedDiscoveryServiceClient
	m   *relayMetrics
}

// SubscribedNames is how many resource names the relay holds for its open
// streams' subscriptions (each stream's, within Options.Limits).
func (r *Relay) SubscribedNames() int64 { return r.names.Load() }

// New returns a Relay.
func New(opts Options) (*Relay, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	ups := map[string]upstreamOf{"": {ads: discovery.NewAggregatedDiscoveryServiceClient(opts.Conn), m: opts.Metrics.forRevision(opts.Revision)}}
	for rev, c := range opts.Revisions {
		ups[rev] = upstreamOf{ads: discovery.NewAggregatedDiscoveryServiceClient(c), m: opts.Metrics.forRevision(rev)}
	}
	return &Relay{opts: opts, log: opts.Logger, ups: ups}, nil
}

// upstream is the istiod of revision rev, and whether the relay has one
// (else the default revision's).
func (r *Relay) upstream(rev string) (upstreamOf, bool) {
	if u, ok := r.ups[rev]; ok {
		return u, true
	}
	return r.ups[""], false
}

// Downstream is the sidecar's side of a stream (a gRPC server stream).
type Downstream[Req, Resp any] interface {
	Context() context.Context
	Recv() (*Req, error)
	Send(*Resp) error
}

// Hooks let the caller see and filter what passes through a stream. Both
// run on the stream's goroutine and must not block for long.
type Hooks[Req, Resp any] struct {
	// Request sees every request of the sidecar, before it is relayed:
	// relay false keeps it from istiod; an error ends the stream with that
	// error. Default: everything is relayed.
	Request func(*Req) (relay bool, err error)
	// Response sees every response sent to the sidecar, after it was sent.
	// Default: none.
	Response func(*Resp)
	// Stop, when closed, ends the stream: the relay returns ErrStopped
	// (a server closing the sidecar's stream). Default: never.
	Stop <-chan struct{}
	// Node returns the node sent to istiod in place of the sidecar's. It
	// is called once, with the node of the sidecar's first request; what
	// it returns (without strippedMetadata) is sent on every upstream
	// stream. An error ends the stream with that error. Default: the
	// sidecar's node.
	Node func(*core.Node) (*core.Node, error)
	// Revision returns the istiod revision the stream is relayed to now
	// ("" the default; a name the relay has no istiod for is served by the
	// default) and a channel closed when it may have changed. It is called
	// when the stream starts and each time that channel closes; when the
	// revision changed, the relay closes the upstream stream and opens one
	// to the new revision's istiod at once, resynchronised as after an
	// istiod restart, while the sidecar's stream stays open. Default: the
	// default revision, always.
	Revision func() (revision string, changed <-chan struct{})
}

// ErrStopped is what SotW and Delta return when Hooks.Stop was closed.
var ErrStopped = errors.New("relay: stream stopped by the server")

// Node metadata that would make istiod manage a WorkloadEntry for the proxy
// (pilot/pkg/autoregistration: auto-registration, health-checked entries).
var strippedMetadata = []string{"AUTO_REGISTER_GROUP", "WORKLOAD_ENTRY"}

// upstreamNode decodes the node sent to istiod (wire: Hooks.Node's, or the
// sidecar's) without the metadata that would make istiod register or
// health-check the proxy itself. It is made for each upstream stream and
// dropped once sent: per stream the relay keeps only the node's encoding, a
// fraction of its decoded size.
func upstreamNode(wire []byte) (*core.Node, error) {
	n := &core.Node{}
	if err := proto.Unmarshal(wire, n); err != nil {
		return nil, fmt.Errorf("decode the node: %w", err)
	}
	for _, k := range strippedMetadata {
		delete(n.GetMetadata().GetFields(), k)
	}
	return n, nil
}

// SotW relays a state-of-the-world ADS stream until the sidecar ends it or
// ctx ends; authorization is the sidecar's authorization header as it sent
// it ("Bearer <token>"), sent to istiod unchanged on every upstream stream.
// It returns the downstream's end (nil when the sidecar closed the stream).
func (r *Relay) SotW(ctx context.Context, down Downstream[discovery.DiscoveryRequest, discovery.DiscoveryResponse], authorization string, hooks Hooks[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
	return run(ctx, r, down, authorization, hooks, newSotwState(r.opts.Limits, &r.names), func(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse], error) {
		return ads.StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	})
}

// Delta relays a Delta ADS stream; see SotW.
func (r *Relay) Delta(ctx context.Context, down Downstream[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse], authorization string, hooks Hooks[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]) error {
	return run(ctx, r, down, authorization, hooks, newDeltaState(r.opts.Limits, &r.names), func(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse], error) {
		return ads.DeltaAggregatedResources(ctx, grpc.WaitForReady(true))
	})
}

// protocol is what the relay knows of one stream's subscriptions, per
// protocol (SotW or Delta).
type protocol[Req, Resp any] interface {
	// node returns the node a request carries, or nil.
	node(*Req) *core.Node
	// Observe records a relayed request of the sidecar (nonce as the
	// sidecar sent it), or refuses it over the stream's Limits; Names and
	// Release as Subscriptions.
	Subscriptions[Req]
	// upstream rewrites a request for the current upstream stream of
	// generation gen: false drops it (the resynchronisation already carries
	// what it says).
	upstream(req *Req, gen uint64) bool
	// sent records a response sent to the sidecar (nonce rewritten).
	sent(*Resp)
	// resync returns the requests that restore the sidecar's subscriptions
	// on a new upstream stream, each of at most maxBytes where the protocol
	// can split them (the first of at most maxBytes - reserve: it carries
	// the node).
	resync(maxBytes, reserve int) []*Req
	setNode(req *Req, n *core.Node)
	nonce(*Resp) *string
	typeURL(*Resp) string
}

// genNonce prefixes an upstream nonce with its stream's generation.
func genNonce(gen uint64, nonce string) string {
	return strconv.FormatUint(gen, 10) + ":" + nonce
}

// parseNonce splits a downstream nonce; ok is false for a nonce the relay
// did not send.
func parseNonce(n string) (gen uint64, nonce string, ok bool) {
	g, rest, found := strings.Cut(n, ":")
	if !found {
		return 0, "", false
	}
	gen, err := strconv.ParseUint(g, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return gen, rest, true
}

// sendQueue bounds the requests waiting to be sent to istiod on one stream
// (a sidecar sends a few per type and push).
const sendQueue = 64

// eventKind tells what a helper goroutine of a stream reports.
type eventKind uint8

const (
	downRequest eventKind = iota // the sidecar sent req
	downEnded                    // the sidecar's stream ended with err
	upOpened                     // opening upstream stream gen ended: stream, cancel, err
	upReceived                   // upstream stream gen answered resp, or ended with err
	upSent                       // the sender of upstream stream gen is done (err: why it stopped)
)

// event is what a helper goroutine reports to the stream's loop.
type event[Req, Resp any] struct {
	kind   eventKind
	gen    uint64
	req    *Req
	resp   *Resp
	stream grpc.BidiStreamingClient[Req, Resp]
	cancel context.CancelFunc
	err    error
	at     time.Time // when upReceived's response was read
}

// relayed is one relayed stream. Its fields are owned by the loop (the
// handler's goroutine, the only one that sends to the sidecar); helpers
// report to it on events: one goroutine reads the sidecar, one reads the
// current upstream stream, and short-lived ones open an upstream stream or
// send it what is queued. Per stream the relay keeps the sidecar's
// subscriptions (p: names and versions, never a response) and a pointer to
// its node.
type relayed[Req, Resp any] struct {
	r      *Relay
	done   chan struct{}   // closed when run returns: the helpers end
	upCtx  context.Context // the caller's ctx carrying the sidecar's authorization
	down   Downstream[Req, Resp]
	hooks  Hooks[Req, Resp]
	p      protocol[Req, Resp]
	open   func(context.Context, discovery.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[Req, Resp], error)
	events chan event[Req, Resp]

	rev     string          // the revision relayed to (Hooks.Revision's)
	up0     upstreamOf      // its istiod
	m       *relayMetrics   // up0.m
	changed <-chan struct{} // closed when rev may have changed; nil: never

	node       []byte // the node sent to istiod (Hooks.Node's, or the sidecar's), encoded; nil until the first request
	nodeID     string
	gen        uint64                              // generation of the current or pending upstream stream
	up         grpc.BidiStreamingClient[Req, Resp] // the current upstream stream; nil when none
	upCancel   context.CancelFunc                  // ends up
	openCancel context.CancelFunc                  // ends the stream being opened; nil when none
	connecting bool
	answered   bool // the current upstream stream answered at least once
	failed     bool // an open upstream stream failed: the next one resynchronises
	wantUp     bool // the sidecar sent a request to relay
	backoff    time.Duration
	retry      <-chan time.Time
	queue      []*Req // requests for up waiting for the sender
	sending    bool   // a sender of up runs
}

// run relays one stream until the sidecar or ctx ends it.
func run[Req, Resp any](ctx context.Context, r *Relay, down Downstream[Req, Resp], authorization string, hooks Hooks[Req, Resp], p protocol[Req, Resp],
	open func(context.Context, discovery.AggregatedDiscoveryServiceClient) (grpc.BidiStreamingClient[Req, Resp], error),
) error {
	// No context of its own: the upstream streams' contexts are cancelled
	// one by one (each a child of the caller's ctx), the helpers end on done.
	s := &relayed[Req, Resp]{
		r: r, down: down, hooks: hooks, p: p, open: open,
		done:     make(chan struct{}),
		upCtx:    metadata.AppendToOutgoingContext(ctx, "authorization", authorization),
		events:   make(chan event[Req, Resp]),
		upCancel: func() {},
	}
	s.selectRevision()
	s.m.streamOpened()
	defer func() {
		close(s.done)
		p.Release()
		s.m.streamClosed()
		s.m.upstreamClosed(s.up != nil)
		s.upCancel()
		if s.openCancel != nil {
			s.openCancel()
		}
	}()
	go s.readDown()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-hooks.Stop:
			return ErrStopped
		case <-s.retry:
			s.retry = nil
			if !s.connecting {
				s.connect()
			}
		case <-s.changed:
			if from := s.rev; s.selectRevision() {
				s.move(from)
			}
		case ev := <-s.events:
			if done, err := s.handle(ev); done {
				return err
			}
		}
	}
}

// report hands ev to the loop; false when the stream ended first.
func (s *relayed[Req, Resp]) report(ev event[Req, Resp]) bool {
	select {
	case s.events <- ev:
		return true
	case <-s.done:
		return false
	}
}

// readDown reads the sidecar's requests.
func (s *relayed[Req, Resp]) readDown() {
	for {
		req, err := s.down.Recv()
		if err != nil {
			s.report(event[Req, Resp]{kind: downEnded, err: err})
			return
		}
		if !s.report(event[Req, Resp]{kind: downRequest, req: req}) {
			return
		}
	}
}

// readUp reads upstream stream gen until it ends.
func (s *relayed[Req, Resp]) readUp(gen uint64, st grpc.BidiStreamingClient[Req, Resp]) {
	for {
		resp, err := st.Recv()
		if !s.report(event[Req, Resp]{kind: upReceived, gen: gen, resp: resp, err: err, at: time.Now()}) || err != nil {
			return
		}
	}
}

// handle applies one event; done ends the stream with err.
func (s *relayed[Req, Resp]) handle(ev event[Req, Resp]) (done bool, err error) {
	m := s.m
	switch ev.kind {
	case downEnded:
		if errors.Is(ev.err, io.EOF) {
			return true, nil
		}
		return true, ev.err
	case downRequest:
		req := ev.req
		if s.node == nil {
			if n := s.p.node(req); n != nil {
				if err := s.keepNode(n); err != nil {
					return true, err
				}
			}
		}
		if s.hooks.Request != nil {
			ok, err := s.hooks.Request(req)
			if err != nil {
				return true, err
			}
			if !ok {
				return false, nil
			}
		}
		if s.node == nil {
			return true, status.Error(codes.InvalidArgument, "the first request of an ADS stream must carry the node")
		}
		if err := s.p.Observe(req); err != nil {
			s.r.log.Info("refused a sidecar's subscription", "node", s.nodeID, "error", err)
			return true, err
		}
		if !s.wantUp {
			// The first request opens the upstream stream, whose
			// resynchronisation carries it.
			s.wantUp = true
			s.connect()
			return false, nil
		}
		if s.up != nil && s.p.upstream(req, s.gen) {
			s.p.setNode(req, nil)
			s.send(req)
		}
	case upOpened:
		if ev.gen != s.gen {
			ev.cancel() // opened for a revision the stream moved from
			return false, nil
		}
		s.connecting, s.openCancel = false, nil
		if ev.err != nil {
			s.drop(fmt.Errorf("open stream: %w", ev.err))
			return false, nil
		}
		s.up, s.upCancel = ev.stream, ev.cancel
		m.upstreamConnected(s.failed)
		go s.readUp(ev.gen, ev.stream)
		node, err := upstreamNode(s.node)
		if err != nil {
			return true, status.Error(codes.Internal, err.Error())
		}
		reserve := 0
		if node != nil {
			reserve = fieldSize(proto.Size(node))
		}
		for i, req := range s.p.resync(s.r.opts.MaxRequestBytes, reserve) {
			if i == 0 {
				s.p.setNode(req, node)
			}
			s.send(req)
		}
	case upReceived:
		if ev.gen != s.gen || s.up == nil {
			return false, nil
		}
		if ev.err != nil {
			s.drop(ev.err)
			return false, nil
		}
		s.answered = true
		n := s.p.nonce(ev.resp)
		*n = genNonce(ev.gen, *n)
		if err := s.down.Send(ev.resp); err != nil {
			return true, err
		}
		s.p.sent(ev.resp)
		m.pushed(s.p.typeURL(ev.resp), ev.at)
		if s.hooks.Response != nil {
			s.hooks.Response(ev.resp)
		}
	case upSent:
		if ev.gen != s.gen || s.up == nil {
			return false, nil // a sender of an earlier stream
		}
		s.sending = false
		if ev.err == nil {
			s.flush()
		} // else the reader reports the stream's status
	}
	return false, nil
}

// keepNode keeps, encoded, the node sent to istiod for the sidecar's node n.
func (s *relayed[Req, Resp]) keepNode(n *core.Node) error {
	up := n
	if s.hooks.Node != nil {
		var err error
		if up, err = s.hooks.Node(n); err != nil {
			return err
		}
	}
	wire, err := proto.Marshal(up)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "the node does not encode: %v", err)
	}
	s.node, s.nodeID = wire, n.GetId()
	if s.node == nil {
		s.node = []byte{} // an empty node is a node
	}
	return nil
}

// connect opens a new upstream stream.
func (s *relayed[Req, Resp]) connect() {
	s.gen++
	s.connecting = true
	g, ads := s.gen, s.up0.ads
	sctx, scancel := context.WithCancel(s.upCtx)
	s.openCancel = scancel
	go func() {
		st, err := s.open(sctx, ads)
		if err != nil {
			scancel()
		}
		if !s.report(event[Req, Resp]{kind: upOpened, gen: g, stream: st, cancel: scancel, err: err}) {
			scancel()
		}
	}()
}

// drop ends the current upstream stream and schedules a reconnect.
func (s *relayed[Req, Resp]) drop(err error) {
	s.m.upstreamFailed(s.up != nil, errorCode(err))
	if s.up != nil {
		s.failed = true // the next stream restores what this one held
	}
	s.upCancel()
	s.upCancel = func() {}
	s.up = nil
	s.queue, s.sending = nil, false
	if s.answered {
		s.backoff = 0
	}
	s.answered = false
	if s.backoff == 0 {
		s.backoff = s.r.opts.MinBackoff
	} else {
		s.backoff = min(2*s.backoff, s.r.opts.MaxBackoff)
	}
	wait := s.backoff/2 + rand.N(s.backoff/2+1)
	s.r.log.Warn("istiod stream failed; the sidecar keeps its configuration, reconnecting", "node", s.nodeID, "revision", revisionLabel(s.rev), "retryIn", wait, "error", err)
	s.retry = time.After(wait)
}

// selectRevision asks Hooks.Revision which revision the stream is relayed
// to; changed tells whether that istiod differs from the one it had.
func (s *relayed[Req, Resp]) selectRevision() (changed bool) {
	rev := ""
	if s.hooks.Revision != nil {
		rev, s.changed = s.hooks.Revision()
	}
	up, ok := s.r.upstream(rev)
	if !ok {
		rev = ""
	}
	if s.up0.ads == nil { // the stream's start
		s.m = up.m
	} else {
		changed = rev != s.rev
	}
	s.rev, s.up0 = rev, up
	return changed
}

// move relays the stream to its new revision's istiod (s.up0), from the
// revision from: the upstream stream to the old istiod (open or being
// opened) is closed and one to the new istiod opened at once, resynchronised
// with the sidecar's subscriptions as after an istiod restart; the sidecar's
// stream stays open and keeps its configuration meanwhile.
func (s *relayed[Req, Resp]) move(from string) {
	old := s.m
	old.streamClosed()
	old.upstreamClosed(s.up != nil)
	s.m = s.up0.m
	s.m.streamOpened()
	s.r.log.Info("moving a sidecar's istiod stream to another revision", "node", s.nodeID, "from", revisionLabel(from), "to", revisionLabel(s.rev))
	if s.up != nil {
		s.failed = true
	}
	s.upCancel()
	s.upCancel = func() {}
	if s.openCancel != nil {
		s.openCancel()
		s.openCancel = nil
	}
	s.up, s.connecting, s.answered = nil, false, false
	s.queue, s.sending = nil, false
	s.retry, s.backoff = nil, 0
	if s.wantUp {
		s.connect()
	}
}

// send queues a request for the current upstream stream; a stream whose
// queue is full (istiod not reading) is dropped and resynchronised later, so
// that the sidecar's stream (its health reports) never waits for istiod.
func (s *relayed[Req, Resp]) send(req *Req) {
	if s.up == nil {
		return
	}
	if len(s.queue) >= sendQueue {
		s.drop(status.Error(codes.ResourceExhausted, "istiod is not reading this stream's requests"))
		return
	}
	s.queue = append(s.queue, req)
	s.flush()
}

// flush starts a sender for what is queued, unless one runs: the sender
// sends in order and ends, so an idle stream holds no sending goroutine.
func (s *relayed[Req, Resp]) flush() {
	if s.sending || len(s.queue) == 0 || s.up == nil {
		return
	}
	batch, st, g := s.queue, s.up, s.gen
	s.queue, s.sending = nil, true
	go func() {
		var err error
		for _, req := range batch {
			if err = st.Send(req); err != nil {
				break
			}
		}
		s.report(event[Req, Resp]{kind: upSent, gen: g, err: err})
	}()
}

// errorCode is the gRPC code an upstream stream failed with: OK when istiod
// ended it without an error (io.EOF), Unknown for an error without a status.
func errorCode(err error) codes.Code {
	if errors.Is(err, io.EOF) {
		return codes.OK
	}
	return status.Code(err)
}
