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
	// Metrics. Default: not recorded.
	Metrics *Metrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.Conn == nil {
		return errors.New("relay: Conn is required")
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
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Relay relays sidecar ADS streams to istiod.
type Relay struct {
	opts Options
	log  *slog.Logger
	ads  discovery.AggregatedDiscoveryServiceClient
}

// New returns a Relay.
func New(opts Options) (*Relay, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Relay{opts: opts, log: opts.Logger, ads: discovery.NewAggregatedDiscoveryServiceClient(opts.Conn)}, nil
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
}

// Node metadata that would make istiod manage a WorkloadEntry for the proxy
// (pilot/pkg/autoregistration: auto-registration, health-checked entries).
var strippedMetadata = []string{"AUTO_REGISTER_GROUP", "WORKLOAD_ENTRY"}

// sanitizeNode returns a copy of n without the metadata that would make
// istiod register or health-check the proxy itself.
func sanitizeNode(n *core.Node) *core.Node {
	n = proto.Clone(n).(*core.Node)
	for _, k := range strippedMetadata {
		delete(n.GetMetadata().GetFields(), k)
	}
	return n
}

// SotW relays a state-of-the-world ADS stream until the sidecar ends it or
// ctx ends; token is the sidecar's bearer token, sent to istiod on every
// upstream stream. It returns the downstream's end (nil when the sidecar
// closed the stream).
func (r *Relay) SotW(ctx context.Context, down Downstream[discovery.DiscoveryRequest, discovery.DiscoveryResponse], token string, hooks Hooks[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
	return run(ctx, r, down, token, hooks, newSotwState(), func(ctx context.Context) (grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse], error) {
		return r.ads.StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	})
}

// Delta relays a Delta ADS stream; see SotW.
func (r *Relay) Delta(ctx context.Context, down Downstream[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse], token string, hooks Hooks[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]) error {
	return run(ctx, r, down, token, hooks, newDeltaState(), func(ctx context.Context) (grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse], error) {
		return r.ads.DeltaAggregatedResources(ctx, grpc.WaitForReady(true))
	})
}

// protocol is what the relay knows of one stream's subscriptions, per
// protocol (SotW or Delta).
type protocol[Req, Resp any] interface {
	// node returns the node a request carries, or nil.
	node(*Req) *core.Node
	// observe records a relayed request of the sidecar (nonce as the
	// sidecar sent it).
	observe(*Req)
	// upstream rewrites a request for the current upstream stream of
	// generation gen: false drops it (the resynchronisation already carries
	// what it says).
	upstream(req *Req, gen uint64) bool
	// sent records a response sent to the sidecar (nonce rewritten).
	sent(*Resp)
	// resync returns the requests that restore the sidecar's subscriptions
	// on a new upstream stream.
	resync() []*Req
	setNode(req *Req, n *core.Node)
	nonce(*Resp) *string
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

// run is the relay loop of one stream. Only this goroutine sends to the
// sidecar and to istiod; one goroutine reads the sidecar, one reads the
// current upstream stream, one opens it.
func run[Req, Resp any](ctx context.Context, r *Relay, down Downstream[Req, Resp], token string, hooks Hooks[Req, Resp], p protocol[Req, Resp],
	open func(context.Context) (grpc.BidiStreamingClient[Req, Resp], error),
) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := r.opts.Metrics
	m.streamOpened()
	defer m.streamClosed()
	upCtx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)

	downReqs := make(chan *Req)
	downErr := make(chan error, 1)
	go func() {
		for {
			req, err := down.Recv()
			if err != nil {
				downErr <- err
				return
			}
			select {
			case downReqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	type opened struct {
		gen    uint64
		stream grpc.BidiStreamingClient[Req, Resp]
		ctx    context.Context // ends with the stream
		cancel context.CancelFunc
		err    error
	}
	type received struct {
		gen  uint64
		resp *Resp
		err  error
	}
	openings := make(chan opened)
	recvs := make(chan received)

	var (
		node       *core.Node
		gen        uint64             // generation of the current or pending upstream stream
		up         chan<- *Req        // the current upstream stream's send queue; nil when none
		upCancel   context.CancelFunc = func() {}
		connecting bool
		answered   bool // the current upstream stream answered at least once
		backoff    time.Duration
		retry      <-chan time.Time
		wantUp     bool // the sidecar sent a request to relay
	)
	defer func() {
		m.upstreamClosed(up != nil)
		upCancel()
	}()

	connect := func() {
		gen++
		connecting = true
		g := gen
		sctx, scancel := context.WithCancel(upCtx)
		go func() {
			st, err := open(sctx)
			if err != nil {
				scancel()
			}
			select {
			case openings <- opened{gen: g, stream: st, ctx: sctx, cancel: scancel, err: err}:
			case <-ctx.Done():
				scancel()
			}
		}()
	}
	// drop ends the current upstream stream and schedules a reconnect.
	drop := func(err error) {
		m.upstreamFailed(up != nil)
		upCancel()
		upCancel = func() {}
		up = nil
		if answered {
			backoff = 0
		}
		answered = false
		switch {
		case backoff == 0:
			backoff = r.opts.MinBackoff
		default:
			backoff = min(2*backoff, r.opts.MaxBackoff)
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		r.log.Warn("istiod stream failed; the sidecar keeps its configuration, reconnecting", "node", node.GetId(), "retryIn", wait, "error", err)
		retry = time.After(wait)
	}
	// send queues a request for the current upstream stream; a stream whose
	// queue is full (istiod not reading) is dropped and resynchronised
	// later, so that the sidecar's stream (its health reports) never waits
	// for istiod.
	send := func(req *Req) {
		if up == nil {
			return
		}
		select {
		case up <- req:
		default:
			drop(errors.New("istiod is not reading this stream's requests"))
		}
	}

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-downErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req := <-downReqs:
			if node == nil {
				if n := p.node(req); n != nil {
					node = sanitizeNode(n)
				}
			}
			if hooks.Request != nil {
				ok, err := hooks.Request(req)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
			}
			if node == nil {
				return status.Error(codes.InvalidArgument, "the first request of an ADS stream must carry the node")
			}
			p.observe(req)
			if !wantUp {
				wantUp = true
				connect()
				continue
			}
			if up != nil && p.upstream(req, gen) {
				p.setNode(req, nil)
				send(req)
			}
		case o := <-openings:
			connecting = false
			if o.gen != gen {
				o.cancel()
				continue
			}
			if o.err != nil {
				drop(fmt.Errorf("open stream: %w", o.err))
				continue
			}
			sendq := make(chan *Req, sendQueue)
			up, upCancel = sendq, o.cancel
			m.upstreamConnected()
			g := o.gen
			st := o.stream
			sctx := o.ctx
			go func() {
				for {
					select {
					case req := <-sendq:
						if err := st.Send(req); err != nil {
							// The reader reports the stream's status.
							return
						}
					case <-sctx.Done():
						return
					}
				}
			}()
			go func() {
				for {
					resp, err := st.Recv()
					select {
					case recvs <- received{gen: g, resp: resp, err: err}:
					case <-ctx.Done():
						return
					}
					if err != nil {
						return
					}
				}
			}()
			for i, req := range p.resync() {
				if i == 0 {
					p.setNode(req, node)
				}
				send(req)
			}
		case rv := <-recvs:
			if rv.gen != gen || up == nil {
				continue
			}
			if rv.err != nil {
				drop(rv.err)
				continue
			}
			answered = true
			n := p.nonce(rv.resp)
			*n = genNonce(rv.gen, *n)
			if err := down.Send(rv.resp); err != nil {
				return err
			}
			p.sent(rv.resp)
			if hooks.Response != nil {
				hooks.Response(rv.resp)
			}
		case <-retry:
			retry = nil
			if !connecting {
				connect()
			}
		}
	}
}
