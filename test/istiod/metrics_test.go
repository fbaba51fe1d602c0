package istiod

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
)

// metricSum is the sum of the samples of name whose labels include want
// (a histogram's count); -1 when there is none.
func metricSum(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	mf, ok := fams[name]
	if !ok {
		return -1
	}
	sum, found := 0.0, false
next:
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	if !found {
		return -1
	}
	return sum
}

// waitMetric scrapes e until ok holds for name's sum over want.
func waitMetric(t *testing.T, e *endpoint, what, name string, want map[string]string, ok func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		v := metricSum(meshkit.Scrape(t, e.metrics), name, want)
		if ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s%v is %v", what, name, want, v)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func atLeast(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
func equal(n float64) func(float64) bool   { return func(v float64) bool { return v == n } }

// firstNotAfter is the NotAfter of the first PEM certificate of data.
func firstNotAfter(t *testing.T, data []byte) float64 {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return float64(c.NotAfter.Unix())
}

// certificateClient is a client of the endpoint's certificate relay with
// token.
func certificateClient(t *testing.T, e *endpoint, token string) func(csr string) error {
	t.Helper()
	conn := meshkit.Dial(t, e.xds, e.rootFile)
	ca := securityv1alpha1.NewIstioCertificateServiceClient(conn)
	return func(csr string) error {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token), 30*time.Second)
		defer cancel()
		_, err := ca.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
		return err
	}
}

// TestIstiodModeMetrics: the endpoint's metrics, scraped from its
// /metrics while a sidecar stream and certificate requests go through it to
// a real istiod, report what happens: streams relayed to the istiod
// revision, the connection to istiod ready, pushes relayed, certificates
// relayed, refused by Embark (by reason) and failed at istiod (a CSR istiod
// refuses, istiod frozen, istiod stopped), the connection and streams failing while istiod
// is stopped and the stream resynchronised when it is back; and the expiry
// of the serving certificate and of istiod's root.
func TestIstiodModeMetrics(t *testing.T) {
	i, err := testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i.Close() })
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpointWith(t, ns, "replica-"+ns, i)
	vm := register(t, wg, 41)
	rev := map[string]string{"istiod_revision": "default"}

	fams := meshkit.Scrape(t, ep.metrics)
	if got, want := metricSum(fams, "embark_istiod_root_expiry_timestamp_seconds", nil), firstNotAfter(t, i.RootCert); got != want {
		t.Errorf("istiod root expiry %v, want %v (its NotAfter)", got, want)
	}
	cert, err := os.ReadFile(ep.rootFile[:len(ep.rootFile)-len("ca.crt")] + "tls.crt")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := metricSum(fams, "embark_serving_certificate_expiry_timestamp_seconds", nil), firstNotAfter(t, cert); got != want {
		t.Errorf("serving certificate expiry %v, want %v (its NotAfter)", got, want)
	}
	if got := metricSum(fams, "embark_xds_relay_streams", rev); got != 0 {
		t.Errorf("relayed streams before any sidecar: %v", got)
	}

	s := vm.connect(t, ep)
	waitMetric(t, ep, "a sidecar stream", "embark_xds_relay_streams", rev, equal(1))
	waitMetric(t, ep, "the istiod stream", "embark_xds_relay_upstream_streams", rev, equal(1))
	waitMetric(t, ep, "connection to istiod", "embark_istiod_connection_state", map[string]string{"state": "ready"}, equal(1))
	fams = meshkit.Scrape(t, ep.metrics)
	if got := metricSum(fams, "embark_xds_relay_pushes_total", map[string]string{"istiod_revision": "default", "type": "envoy.config.listener.v3.Listener"}); got < 1 {
		t.Errorf("listener pushes relayed: %v", got)
	}
	if got := metricSum(fams, "embark_xds_relay_push_added_seconds", rev); got < 1 {
		t.Errorf("added-latency observations: %v", got)
	}
	for _, name := range []string{"embark_xds_relay_upstream_failures_total", "embark_xds_relay_resyncs_total"} {
		if got := metricSum(fams, name, rev); got != 0 {
			t.Errorf("%s = %v on a healthy run", name, got)
		}
	}

	ask := certificateClient(t, ep, vm.Token)
	if err := ask(csrPEM(t)); err != nil {
		t.Fatalf("certificate through Embark: %v", err)
	}
	if err := ask(""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a request without a CSR: %v, want InvalidArgument", err)
	}
	if err := certificateClient(t, ep, "not-a-token")(csrPEM(t)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a request with a bad token: %v, want Unauthenticated", err)
	}
	if err := ask("-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgQ1NS\n-----END CERTIFICATE REQUEST-----\n"); err == nil {
		t.Error("istiod signed a request that is no CSR")
	}
	fams = meshkit.Scrape(t, ep.metrics)
	for _, c := range []struct {
		name string
		lv   map[string]string
		want func(float64) bool
	}{
		{"embark_ca_requests_total", map[string]string{"code": "OK"}, equal(1)},
		{"embark_ca_refusals_total", map[string]string{"reason": "NoCSR"}, equal(1)},
		{"embark_ca_refusals_total", map[string]string{"reason": "Unauthenticated"}, equal(1)},
		{"embark_ca_istiod_failures_total", nil, equal(1)},
		{"embark_ca_istiod_request_duration_seconds", nil, equal(2)},
	} {
		if got := metricSum(fams, c.name, c.lv); !c.want(got) {
			t.Errorf("%s%v = %v", c.name, c.lv, got)
		}
	}

	// istiod frozen (slow): the certificate request times out at the
	// relay's 10s and is answered Unavailable; istiod's latency shows it.
	i.Pause()
	err = ask(csrPEM(t))
	i.Resume()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a certificate request to a frozen istiod: %v, want Unavailable", err)
	}
	fams = meshkit.Scrape(t, ep.metrics)
	if got := metricSum(fams, "embark_ca_istiod_failures_total", map[string]string{"code": "Unavailable"}); got != 1 {
		t.Errorf("certificate requests failed at a frozen istiod: %v, want 1", got)
	}
	if h := fams["embark_ca_istiod_request_duration_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 3 || h.GetSampleSum() < 10 {
		t.Errorf("istiod latency: %d requests, %vs in all; want 3 with the frozen one's 10s", h.GetSampleCount(), h.GetSampleSum())
	}

	// istiod stops: the connection leaves ready, the istiod stream fails
	// (the sidecar's stays), a certificate request fails at istiod.
	i.Stop()
	waitMetric(t, ep, "connection to a stopped istiod", "embark_istiod_connection_state", map[string]string{"state": "ready"}, equal(0))
	waitMetric(t, ep, "istiod stream failures", "embark_xds_relay_upstream_errors_total", rev, atLeast(1))
	waitMetric(t, ep, "relayed streams with istiod stopped", "embark_xds_relay_upstream_streams", rev, equal(0))
	if got := metricSum(meshkit.Scrape(t, ep.metrics), "embark_xds_relay_streams", rev); got != 1 {
		t.Errorf("sidecar streams with istiod stopped: %v, want 1", got)
	}
	if err := ask(csrPEM(t)); status.Code(err) != codes.Unavailable {
		t.Errorf("a certificate request with istiod stopped: %v, want Unavailable", err)
	}
	waitMetric(t, ep, "certificate requests failed at a stopped istiod", "embark_ca_istiod_failures_total", map[string]string{"code": "Unavailable"}, equal(2))

	// istiod is back: the stream resynchronises on a new istiod stream.
	if err := i.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, ep, "resynchronisation", "embark_xds_relay_resyncs_total", rev, atLeast(1))
	waitMetric(t, ep, "connection to istiod again", "embark_istiod_connection_state", map[string]string{"state": "ready"}, equal(1))
	waitMetric(t, ep, "the istiod stream again", "embark_xds_relay_upstream_streams", rev, equal(1))
	s.cancel()
	waitMetric(t, ep, "the sidecar gone", "embark_xds_relay_streams", rev, equal(0))
	t.Logf("istiod stream errors by code: %v", meshkit.Scrape(t, ep.metrics)["embark_xds_relay_upstream_errors_total"].GetMetric())
}
