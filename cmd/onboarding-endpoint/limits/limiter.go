package limits

import (
	"container/list"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Refusal kinds (metrics label "limit").
const (
	LimitSourceConnections = "source_connections"
	LimitConnections       = "connections"
	LimitSourceRate        = "source_rate"
	LimitSources           = "sources"
)

// Metrics count refusals of every Limiter built with them.
type Metrics struct {
	refused *prometheus.CounterVec
}

// NewMetrics registers embark_limits_refused_total{server,limit} with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "embark_limits_refused_total",
		Help: "Connections and requests refused by a limit, by server and limit.",
	}, []string{"server", "limit"})}
	if reg != nil {
		if err := reg.Register(m.refused); err != nil {
			return nil, fmt.Errorf("register limits metrics: %w", err)
		}
	}
	return m, nil
}

// Limiter enforces the per-source and total limits of one server.
type Limiter struct {
	opts    Options
	server  string
	metrics *Metrics
	now     func() time.Time

	mu      sync.Mutex
	total   int
	lru     *list.List // of *source, most recently seen first
	sources map[netip.Addr]*list.Element

	refusedMu sync.Mutex
	refused   map[string]int
}

type source struct {
	addr   netip.Addr
	conns  int
	bucket *rate.Limiter
	seen   time.Time
}

// New returns the Limiter of the server named server (a metrics label),
// with opts defaulted. metrics may be nil.
func New(server string, opts Options, metrics *Metrics) (*Limiter, error) {
	opts.SetDefaults()
	if name, msg, ok := opts.Validate(); !ok {
		return nil, fmt.Errorf("limits: %s %s", name, msg)
	}
	return &Limiter{
		opts: opts, server: server, metrics: metrics, now: time.Now,
		lru: list.New(), sources: map[netip.Addr]*list.Element{}, refused: map[string]int{},
	}, nil
}

// Options returns the defaulted limits.
func (l *Limiter) Options() Options { return l.opts }

// Refused returns how many connections or requests limit refused.
func (l *Limiter) Refused(limit string) int {
	l.refusedMu.Lock()
	defer l.refusedMu.Unlock()
	return l.refused[limit]
}

func (l *Limiter) refuse(limit string) {
	l.refusedMu.Lock()
	l.refused[limit]++
	l.refusedMu.Unlock()
	if l.metrics != nil {
		l.metrics.refused.WithLabelValues(l.server, limit).Inc()
	}
}

// sourceOf returns the entry of addr, creating it (and forgetting expired or
// least recently seen idle sources) when needed; nil when the table is full
// of sources holding connections. Called with l.mu held.
func (l *Limiter) sourceOf(addr netip.Addr) *source {
	now := l.now()
	if el, ok := l.sources[addr]; ok {
		l.lru.MoveToFront(el)
		s := el.Value.(*source)
		s.seen = now
		return s
	}
	// Forget expired idle sources from the least recently seen end.
	for el := l.lru.Back(); el != nil; {
		prev := el.Prev()
		s := el.Value.(*source)
		if now.Sub(s.seen) < l.opts.SourceExpiry.Duration {
			break
		}
		if s.conns == 0 {
			l.forget(el)
		}
		el = prev
	}
	for el := l.lru.Back(); len(l.sources) >= l.opts.MaxSources && el != nil; {
		prev := el.Prev()
		if el.Value.(*source).conns == 0 {
			l.forget(el)
		}
		el = prev
	}
	if len(l.sources) >= l.opts.MaxSources {
		return nil
	}
	s := &source{addr: addr, seen: now, bucket: rate.NewLimiter(rate.Limit(l.opts.RequestsPerSecondPerSource), l.opts.RequestBurstPerSource)}
	l.sources[addr] = l.lru.PushFront(s)
	return s
}

func (l *Limiter) forget(el *list.Element) {
	l.lru.Remove(el)
	delete(l.sources, el.Value.(*source).addr)
}

// Sources returns how many source addresses are remembered.
func (l *Limiter) Sources() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sources)
}

// acquire admits one connection of addr, or says which limit refuses it.
func (l *Limiter) acquire(addr netip.Addr) (release func(), limit string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.opts.MaxConnections {
		return nil, LimitConnections
	}
	s := l.sourceOf(addr)
	switch {
	case s == nil:
		return nil, LimitSources
	case s.conns >= l.opts.MaxConnectionsPerSource:
		return nil, LimitSourceConnections
	}
	s.conns++
	l.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			s.conns--
			l.total--
			s.seen = l.now()
		})
	}, ""
}

// Allow takes one request token of addr's bucket.
func (l *Limiter) Allow(addr netip.Addr) bool {
	l.mu.Lock()
	s := l.sourceOf(addr)
	var ok bool
	if s != nil {
		ok = s.bucket.AllowN(l.now(), 1)
	}
	l.mu.Unlock()
	if !ok {
		l.refuse(LimitSourceRate)
	}
	return ok
}

// addrOf is the IP of a net.Addr (IPv4-mapped IPv6 unmapped); false when
// it has none (a Unix socket: not limited).
func addrOf(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	case nil:
		return netip.Addr{}, false
	default:
		ap, err := netip.ParseAddrPort(a.String())
		return ap.Addr().Unmap(), err == nil
	}
}

// Listen wraps lis so that connections over MaxConnections or
// MaxConnectionsPerSource are closed as soon as they are accepted.
func (l *Limiter) Listen(lis net.Listener) net.Listener {
	return &listener{Listener: lis, l: l}
}

type listener struct {
	net.Listener
	l *Limiter
}

// Accept returns the next admitted connection.
func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, ok := addrOf(c.RemoteAddr())
		if !ok {
			return c, nil
		}
		release, limit := ln.l.acquire(addr)
		if release == nil {
			ln.l.refuse(limit)
			_ = c.Close()
			continue
		}
		return &conn{Conn: c, release: release}, nil
	}
}

type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	c.release()
	return c.Conn.Close()
}

// errRate is the status of a call over its source's rate.
func errRate(addr netip.Addr) error {
	return status.Errorf(codes.ResourceExhausted, "too many requests from %s; retry later", addr)
}

// allowPeer applies the source's rate to the call of ctx.
func (l *Limiter) allowPeer(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	addr, ok := addrOf(p.Addr)
	if !ok || l.Allow(addr) {
		return nil
	}
	return errRate(addr)
}

// GRPCServerOptions are the options enforcing the limits on a gRPC server:
// MaxConcurrentStreams, keepalive enforcement and parameters, the idle
// limit, the message size and the per-source rate of new calls (gRPC shares
// write buffers between connections by itself, so an idle sidecar's
// connection keeps none). Serve it on l.Listen(lis) for the connection
// limits.
func (l *Limiter) GRPCServerOptions() []grpc.ServerOption {
	o := l.opts
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(o.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(o.MaxRecvMessageBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: o.KeepaliveMinTime.Duration, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: o.MaxConnectionIdle.Duration,
			Time:              o.KeepaliveTime.Duration,
			Timeout:           o.KeepaliveTimeout.Duration,
		}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if err := l.allowPeer(ctx); err != nil {
				return nil, err
			}
			return next(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			if err := l.allowPeer(ss.Context()); err != nil {
				return err
			}
			return next(srv, ss)
		}),
	}
}

// TLSServerOptions serve TLS with cfg. A TLS connection buffers a whole
// record itself, and grpc-go takes its read buffer from a shared pool only
// while bytes are ready on a plain TCP connection: over TLS it would keep a
// 32 KiB read buffer per connection on top of the TLS record buffer (half of
// what an idle sidecar's connection costs the server), so the server
// transport reads straight from the TLS connection.
func TLSServerOptions(cfg *tls.Config) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg)), grpc.ReadBufferSize(0)}
}

// HTTP wraps h with the per-source request rate (429 Too Many Requests).
func (l *Limiter) HTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil && !l.Allow(ap.Addr().Unmap()) {
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(1/l.opts.RequestsPerSecondPerSource))))
			http.Error(w, "too many requests from "+ap.Addr().Unmap().String()+"; retry later", http.StatusTooManyRequests)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// HTTPServer applies the limits to srv: write, read-header and idle
// timeouts, header size and the per-source request rate. Serve it on
// l.Listen(lis) for the connection limits.
func (l *Limiter) HTTPServer(srv *http.Server) {
	srv.WriteTimeout = l.opts.HTTPWriteTimeout.Duration
	srv.IdleTimeout = l.opts.MaxConnectionIdle.Duration
	srv.ReadHeaderTimeout = l.opts.HTTPReadHeaderTimeout.Duration
	srv.MaxHeaderBytes = 64 << 10
	srv.Handler = l.HTTP(srv.Handler)
}
