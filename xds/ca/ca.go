// Package ca relays istiod's certificate service to VMs: the onboarding
// endpoint serves istio.v1.auth.IstioCertificateService on its own xDS
// address (what pilot-agent's CA_ADDR defaults to), so a VM needs to reach
// one address. Each request's caller is authenticated exactly as an xDS
// stream is (its bearer token bound to a live registration; see
// xds.Server.AuthorizeCertificate), then the request is sent to istiod's CA
// with the caller's own token: istiod reviews that token (audience istio-ca)
// and certifies the token's service account, never anything the request
// claims. The validity it asks istiod for is capped (see CappedValidity):
// never beyond the caller's token, which deleting the registration voids,
// nor beyond MaxValidity, so a deleted registration's mesh identity ends
// within that bound. Requests are bounded in size, rate, concurrency and time; the
// shared rate is charged only after the caller is authenticated, so an
// unauthenticated flood (bounded per source by the server's limits) cannot
// starve registered sidecars.
package ca

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/xds"
)

// Defaults of Options.
const (
	DefaultMaxRequestBytes = 16 << 10
	DefaultRate            = 50.0
	DefaultBurst           = 100
	DefaultMaxInFlight     = 64
	DefaultTimeout         = 10 * time.Second
	// DefaultMaxValidity caps the validity relayed to istiod.
	DefaultMaxValidity = 24 * time.Hour
	// MaxValidity bounds the validity a caller may ask for (a request
	// asking for more is refused InvalidArgument; istiod applies its own
	// maximum as well) and Options.MaxValidity.
	MaxValidity = 90 * 24 * time.Hour
)

// Authorizer authenticates a certificate request's caller from the request
// context (*xds.Server satisfies it). Its errors carry gRPC status codes.
type Authorizer interface {
	AuthorizeCertificate(ctx context.Context) (*xds.CertificateCaller, error)
}

var _ Authorizer = (*xds.Server)(nil)

// Options configures a Relay. Every field documents its default.
type Options struct {
	// Upstream is the connection to istiod's secure port (package
	// xds/upstream). Required.
	Upstream grpc.ClientConnInterface
	// Revisions reach the CAs of other istiod revisions, by revision name:
	// a caller's request goes to the revision RevisionOf names for its
	// registration, so a workload moved to a canary istiod is certified by
	// it. Default: none (Upstream for all).
	Revisions map[string]grpc.ClientConnInterface
	// RevisionOf names the revision serving a registration ("" the
	// default; a name without a connection in Revisions is the default).
	// Default: the default revision for all.
	RevisionOf func(ctx context.Context, registration types.NamespacedName) string
	// Authorizer authenticates callers. Required.
	Authorizer Authorizer
	// MaxRequestBytes bounds a request's encoded size (a CSR is about 1
	// KiB). Default 16 KiB.
	MaxRequestBytes int
	// Rate and Burst bound the authenticated requests per second this
	// replica relays (token bucket, charged after authentication); over it
	// requests fail with ResourceExhausted and pilot-agent retries with
	// backoff. Defaults 50/s, burst 100.
	Rate  float64
	Burst int
	// MaxInFlight bounds requests waiting for istiod at once. Default 64.
	MaxInFlight int
	// Timeout bounds one request to istiod. Default 10s.
	Timeout time.Duration
	// MaxValidity caps the validity of the certificates relayed: istiod
	// is asked for at most this, and at most the caller's token's remaining
	// lifetime (see CappedValidity). At most MaxValidity (the constant).
	// Default DefaultMaxValidity (24h).
	MaxValidity time.Duration
	// Clock tells the time the token's remaining lifetime is counted
	// from. Default time.Now.
	Clock func() time.Time
	// Metrics. Default: not recorded.
	Metrics *Metrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.Upstream == nil || o.Authorizer == nil {
		return errors.New("ca: Upstream and Authorizer are required")
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxValidity <= 0 {
		o.MaxValidity = DefaultMaxValidity
	}
	if o.MaxValidity > MaxValidity {
		return fmt.Errorf("ca: MaxValidity %s is over %s", o.MaxValidity, MaxValidity)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Relay serves istio.v1.auth.IstioCertificateService by relaying to istiod.
type Relay struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	opts     Options
	upstream securityv1alpha1.IstioCertificateServiceClient
	revs     map[string]securityv1alpha1.IstioCertificateServiceClient
	limit    *rate.Limiter
	inFlight chan struct{}
}

var _ securityv1alpha1.IstioCertificateServiceServer = (*Relay)(nil)

// New returns a Relay.
func New(opts Options) (*Relay, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	revs := make(map[string]securityv1alpha1.IstioCertificateServiceClient, len(opts.Revisions))
	for rev, c := range opts.Revisions {
		revs[rev] = securityv1alpha1.NewIstioCertificateServiceClient(c)
	}
	return &Relay{
		opts:     opts,
		upstream: securityv1alpha1.NewIstioCertificateServiceClient(opts.Upstream),
		revs:     revs,
		limit:    rate.NewLimiter(rate.Limit(opts.Rate), opts.Burst),
		inFlight: make(chan struct{}, opts.MaxInFlight),
	}, nil
}

// Register adds the certificate service to g (the xDS server's gRPC server).
func (r *Relay) Register(g grpc.ServiceRegistrar) {
	securityv1alpha1.RegisterIstioCertificateServiceServer(g, r)
}

// clusterIDHeader is the header pilot-agent names its cluster with; istiod
// uses it to pick the cluster that reviews the token.
const clusterIDHeader = "clusterid"

// CreateCertificate authenticates the caller, then asks istiod to sign the
// request with the caller's token.
func (r *Relay) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	start := time.Now()
	resp, err := r.create(ctx, req)
	r.opts.Metrics.observe(status.Code(err), time.Since(start))
	return resp, err
}

func (r *Relay) create(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	m := r.opts.Metrics
	if n := proto.Size(req); n > r.opts.MaxRequestBytes {
		m.refused(reasonTooLarge)
		return nil, status.Errorf(codes.InvalidArgument, "certificate request of %d bytes exceeds the limit of %d", n, r.opts.MaxRequestBytes)
	}
	if req.GetCsr() == "" {
		m.refused(reasonNoCSR)
		return nil, status.Error(codes.InvalidArgument, "certificate request without a CSR")
	}
	if v := req.GetValidityDuration(); v < 0 || v > int64(MaxValidity/time.Second) {
		m.refused(reasonValidity)
		return nil, status.Errorf(codes.InvalidArgument, "validity of %ds is outside 0..%ds", v, int64(MaxValidity/time.Second))
	}
	// Authenticate before the shared budget: an unauthenticated caller is
	// bounded by its source's own rate (the xDS server's per-source limit,
	// package cmd/onboarding-endpoint/limits) and must never spend what sidecars with a
	// live registration need. Authentication is cheap for them (reviews
	// are cached) and a malformed token is refused without a TokenReview.
	caller, err := r.opts.Authorizer.AuthorizeCertificate(ctx)
	if err != nil {
		m.refused(status.Code(err).String())
		return nil, err
	}
	if !r.limit.Allow() {
		m.refused(reasonRateLimited)
		return nil, status.Error(codes.ResourceExhausted, "certificate requests over this endpoint's rate limit; retry later")
	}
	select {
	case r.inFlight <- struct{}{}:
		defer func() { <-r.inFlight }()
	default:
		m.refused(reasonInFlight)
		return nil, status.Error(codes.ResourceExhausted, "too many certificate requests waiting for istiod; retry later")
	}
	asked := req.GetValidityDuration()
	req.ValidityDuration = CappedValidity(asked, r.opts.MaxValidity, caller.Expires.Sub(r.opts.Clock()))
	md := metadata.Pairs("authorization", "Bearer "+caller.Token)
	if in, ok := metadata.FromIncomingContext(ctx); ok {
		if v := in.Get(clusterIDHeader); len(v) == 1 && len(v[0]) <= 253 {
			md.Set(clusterIDHeader, v[0])
		}
	}
	uctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), r.opts.Timeout)
	defer cancel()
	sent := time.Now()
	resp, err := r.upstreamOf(ctx, caller.Registration).CreateCertificate(uctx, req)
	m.istiodAnswered(time.Since(sent))
	if err != nil {
		st := status.Convert(err)
		code := st.Code()
		if code == codes.DeadlineExceeded && ctx.Err() == nil {
			code = codes.Unavailable // istiod too slow, not the caller's deadline
		}
		m.istiodFailed(code)
		r.opts.Logger.Info("istiod refused or failed a certificate request", "registration", caller.Registration.String(), "code", st.Code().String(), "error", st.Message())
		return nil, status.Errorf(code, "istiod's CA: %s", st.Message())
	}
	if len(resp.GetCertChain()) == 0 {
		m.istiodFailed(codes.Internal)
		return nil, status.Error(codes.Internal, "istiod's CA answered without a certificate chain")
	}
	r.opts.Logger.Debug("relayed a certificate", "registration", caller.Registration.String(), "serviceAccount", caller.ServiceAccount.String(),
		"askedSeconds", asked, "validitySeconds", req.GetValidityDuration())
	return resp, nil
}

// upstreamOf is the CA of the istiod revision serving registration.
func (r *Relay) upstreamOf(ctx context.Context, registration types.NamespacedName) securityv1alpha1.IstioCertificateServiceClient {
	if r.opts.RevisionOf == nil {
		return r.upstream
	}
	if c, ok := r.revs[r.opts.RevisionOf(ctx, registration)]; ok {
		return c
	}
	return r.upstream
}

// CappedValidity is the validity, in seconds, the relay asks istiod for when
// a caller asks for asked seconds (0: istiod's default) holding a token
// valid for tokenLeft more: asked, capped at maxValidity and at tokenLeft
// (whole seconds, at least 1), and the cap itself for 0, so that istiod's
// default (which may be longer) never applies. A deleted registration's
// token is void at once; its certificates end at the latest with the
// token's lifetime.
func CappedValidity(asked int64, maxValidity, tokenLeft time.Duration) int64 {
	limit := max(int64(min(maxValidity, tokenLeft)/time.Second), 1)
	if asked <= 0 {
		return limit
	}
	return min(asked, limit)
}

// Reasons of embark_ca_refusals_total besides the authorizer's gRPC code
// (Unauthenticated, PermissionDenied, ...).
const (
	reasonTooLarge    = "RequestTooLarge"
	reasonNoCSR       = "NoCSR"
	reasonValidity    = "ValidityOutOfRange"
	reasonRateLimited = "RateLimited"
	reasonInFlight    = "TooManyInFlight"
)

// Metrics are the relay's metrics; a nil *Metrics records nothing.
type Metrics struct {
	requests       *prometheus.CounterVec
	duration       prometheus.Histogram
	refusals       *prometheus.CounterVec
	istiodFailures *prometheus.CounterVec
	istiodDuration prometheus.Histogram
}

// NewMetrics registers with reg embark_ca_requests_total{code} (requests
// answered, by gRPC code), embark_ca_request_duration_seconds (time to
// answer), embark_ca_refusals_total{reason} (requests Embark refused before
// istiod: RequestTooLarge, NoCSR, ValidityOutOfRange, the authorizer's code
// such as Unauthenticated or PermissionDenied, RateLimited,
// TooManyInFlight), embark_ca_istiod_failures_total{code} (requests istiod
// refused or failed, or that did not reach it; Unavailable for a timeout)
// and embark_ca_istiod_request_duration_seconds (istiod's part of the
// time).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.002, 2, 14)
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_ca_requests_total",
			Help: "Certificate requests relayed to istiod's CA, by gRPC status code answered.",
		}, []string{"code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_ca_request_duration_seconds",
			Help:    "Time to answer a certificate request, istiod's signing included.",
			Buckets: buckets,
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_ca_refusals_total",
			Help: "Certificate requests Embark refused before asking istiod, by reason.",
		}, []string{"reason"}),
		istiodFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_ca_istiod_failures_total",
			Help: "Certificate requests istiod's CA refused or failed, or that did not reach it, by gRPC status code.",
		}, []string{"code"}),
		istiodDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_ca_istiod_request_duration_seconds",
			Help:    "Time istiod took to answer a relayed certificate request.",
			Buckets: buckets,
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.refusals, m.istiodFailures, m.istiodDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register CA relay metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) observe(code codes.Code, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(code.String()).Inc()
	m.duration.Observe(d.Seconds())
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) istiodAnswered(d time.Duration) {
	if m != nil {
		m.istiodDuration.Observe(d.Seconds())
	}
}

func (m *Metrics) istiodFailed(code codes.Code) {
	if m != nil {
		m.istiodFailures.WithLabelValues(code.String()).Inc()
	}
}
