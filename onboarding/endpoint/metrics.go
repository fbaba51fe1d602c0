package endpoint

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Metrics are the onboarding API's Prometheus metrics. A nil *Metrics
// records nothing.
type Metrics struct {
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	denials       *prometheus.CounterVec
	registrations *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "onboarding", Name: "requests_total",
			Help: "Onboarding API requests by method and gRPC code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "embark", Subsystem: "onboarding", Name: "request_duration_seconds",
			Help:    "Onboarding API request latency by method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"method"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "onboarding", Name: "denials_total",
			Help: "Refused onboarding requests by stage (authorize, register, token) and reason.",
		}, []string{"stage", "reason"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "onboarding", Name: "registrations_total",
			Help: "Successful registrations; result is created or reused.",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.denials, m.registrations} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// UnaryInterceptor records every request's code and latency.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		if m != nil {
			m.latency.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
			m.requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
		}
		return resp, err
	}
}

func (m *Metrics) denied(stage, reason string) {
	if m != nil {
		m.denials.WithLabelValues(stage, reason).Inc()
	}
}

func (m *Metrics) registered(created bool) {
	if m == nil {
		return
	}
	if created {
		m.registrations.WithLabelValues("created").Inc()
	} else {
		m.registrations.WithLabelValues("reused").Inc()
	}
}
