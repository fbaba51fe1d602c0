package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The agent's metrics (see Collector).
var (
	buildInfoDesc = prometheus.NewDesc("embark_agent_build_info",
		"Always 1: the onboarding agent's version.", []string{"version"}, nil)
	onboardedDesc = prometheus.NewDesc("embark_agent_onboarded",
		"1 while the host holds a registration and the sidecar's bootstrap is written, else 0.", nil, nil)
	lastErrorDesc = prometheus.NewDesc("embark_agent_last_onboarding_error",
		"1 for the reason of the last failed onboarding attempt (PlatformCredential, BootstrapWrite, or the endpoint's gRPC code such as PermissionDenied); absent once onboarded.", []string{"reason"}, nil)
	lastErrorTimeDesc = prometheus.NewDesc("embark_agent_last_onboarding_error_timestamp_seconds",
		"When the last onboarding attempt failed, Unix seconds; absent once onboarded.", nil, nil)
	failuresDesc = prometheus.NewDesc("embark_agent_onboarding_failures_total",
		"Failed onboarding attempts, by reason.", []string{"reason"}, nil)
	tokenExpiryDesc = prometheus.NewDesc("embark_agent_token_expiry_timestamp_seconds",
		"When the agent's current token expires, Unix seconds: onboarding (the agent's own) or sidecar (the sidecar's credential); absent before onboarding.", []string{"token"}, nil)
	sidecarReadyDesc = prometheus.NewDesc("embark_agent_sidecar_ready",
		"1 when the sidecar's readiness endpoint (metrics.sidecarReadyURL) answers 200 at the scrape, else 0.", nil, nil)
)

// sidecarProbeTimeout bounds the readiness request of one scrape.
const sidecarProbeTimeout = time.Second

// collector reports the agent's state at each scrape.
type collector struct {
	a        *Agent
	readyURL string
	client   *http.Client
}

var _ prometheus.Collector = collector{}

// Collector returns the agent's metrics: embark_agent_build_info{version},
// embark_agent_onboarded, embark_agent_last_onboarding_error{reason} and
// its _timestamp_seconds, embark_agent_onboarding_failures_total{reason},
// embark_agent_token_expiry_timestamp_seconds{token} and, when
// sidecarReadyURL is set, embark_agent_sidecar_ready (the URL asked at each
// scrape).
func (a *Agent) Collector(sidecarReadyURL string) prometheus.Collector {
	return collector{a: a, readyURL: sidecarReadyURL, client: &http.Client{Timeout: sidecarProbeTimeout}}
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{buildInfoDesc, onboardedDesc, lastErrorDesc, lastErrorTimeDesc, failuresDesc, tokenExpiryDesc, sidecarReadyDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	a.mu.Lock()
	st := a.state
	failures := make(map[string]uint64, len(st.failures))
	for k, v := range st.failures {
		failures[k] = v
	}
	var sess session
	if a.session != nil {
		sess = *a.session
	}
	a.mu.Unlock()

	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(buildInfoDesc, 1, a.opts.Version)
	onboarded := 0.0
	if st.onboarded {
		onboarded = 1
		gauge(tokenExpiryDesc, float64(sess.tokenExpiry.Unix()), "onboarding")
		if sess.hasSidecarCred {
			gauge(tokenExpiryDesc, float64(sess.sidecarExpiry.Unix()), "sidecar")
		}
	}
	gauge(onboardedDesc, onboarded)
	if st.lastError != "" {
		gauge(lastErrorDesc, 1, st.lastError)
		gauge(lastErrorTimeDesc, float64(st.lastErrorAt.Unix()))
	}
	for reason, n := range failures {
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(n), reason)
	}
	if c.readyURL != "" {
		gauge(sidecarReadyDesc, c.sidecarReady())
	}
}

// sidecarReady asks the readiness URL (within sidecarProbeTimeout): 1 for
// a 200 answer, else 0.
func (c collector) sidecarReady() float64 {
	resp, err := c.client.Get(c.readyURL) // bounded by the client's timeout
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return 1
	}
	return 0
}

// ServeMetrics serves reg's metrics on addr's /metrics until ctx ends. It
// returns once listening, or the error of listening.
func ServeMetrics(ctx context.Context, addr string, reg prometheus.Gatherer, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics.address: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "address", addr, "error", err.Error())
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	log.Info("serving metrics", "address", lis.Addr().String())
	return nil
}
