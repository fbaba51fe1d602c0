package xds

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	meshconfig "istio.io/api/mesh/v1alpha1"
	istiometa "istio.io/api/meta/v1alpha1"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
)

// probedApp is the workload's application: an HTTP server whose /ready the
// test turns healthy and unhealthy.
type probedApp struct {
	healthy atomic.Bool
	probes  atomic.Int32
	port    int
}

func startProbedApp(t *testing.T) *probedApp {
	t.Helper()
	a := &probedApp{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.probes.Add(1)
		if r.URL.Path != "/ready" || !a.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if a.port, err = strconv.Atoi(u.Port()); err != nil {
		t.Fatal(err)
	}
	return a
}

// healthState is a workload's Healthy condition on its WorkloadEntry and
// registration.
type healthState struct {
	we  *istiometa.IstioCondition
	war *metav1.Condition
}

func readHealth(t *testing.T, key types.NamespacedName) healthState {
	t.Helper()
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), key, we); err != nil {
		t.Fatal(err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	var s healthState
	for _, c := range we.Status.Conditions {
		if c.GetType() == registry.ConditionHealthy {
			s.we = c
		}
	}
	s.war = meta.FindStatusCondition(war.Status.Conditions, registry.ConditionHealthy)
	return s
}

// waitHealthStatus waits until both conditions have status.
func waitHealthStatus(t *testing.T, key types.NamespacedName, status metav1.ConditionStatus, agent *istioagent.Agent) healthState {
	t.Helper()
	var s healthState
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		s = readHealth(t, key)
		return s.we != nil && s.war != nil && s.we.GetStatus() == string(status) && s.war.Status == status, nil
	})
	if err != nil {
		t.Fatalf("Healthy never became %s: WorkloadEntry %v, registration %v\npilot-agent:\n%s", status, s.we, s.war, agent.Logs())
	}
	return s
}

// TestRealSidecarProbeDrivesHealthyCondition runs Istio's pilot-agent with
// the readiness probe of the registration's WorkloadGroup snapshot against
// an application of the test, and follows the Healthy condition the
// HealthMirror writes as the application fails, recovers and fails again.
func TestRealSidecarProbeDrivesHealthyCondition(t *testing.T) {
	ns := env.Namespace(t)
	app := startProbedApp(t)

	wg := fixtures.WorkloadGroup(ns, nil)
	wg.Spec.Template.Network = "vms"
	wg.Spec.Probe = &istioapi.ReadinessProbe{
		PeriodSeconds: 1, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
		HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Host: "127.0.0.1", Port: uint32(app.port), Path: "/ready"}},
	}
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	w := register(t, ns, "i-0000000000000000c", "10.0.8.1")
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), w.key, we); err != nil {
		t.Fatal(err)
	}
	if we.Annotations[registry.AnnotationHealthChecksEnabled] != "true" || presence.WorkloadEntryHealth(we) != "unhealthy" {
		t.Fatalf("a new WorkloadEntry of a group with a probe must be unhealthy (annotation %q, conditions %v)",
			we.Annotations[registry.AnnotationHealthChecksEnabled], we.Status.Conditions)
	}

	metricsReg := prometheus.NewRegistry()
	r := startReplicaWith(t, "replica-h", nil, func(ctx context.Context, conns *presence.Connections) (HealthSink, func()) {
		m, err := presence.NewHealthMetrics(metricsReg, informers)
		if err != nil {
			t.Fatal(err)
		}
		mirror, err := presence.NewHealthMirror(ctx, presence.HealthOptions{
			Client: env.Client, Connections: conns, Damping: -1, Metrics: m,
			Logger: fixtures.Logger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		return mirror, mirror.Wait
	})

	// The probe pilot-agent runs is the one of the registration's snapshot,
	// as the bootstrap hands it over (see endpoint's TestBootstrapCarriesTheProbe).
	group, err := registry.GroupSpec(w.res.Registration.Spec.WorkloadGroup)
	if err != nil {
		t.Fatal(err)
	}
	connectStart := time.Now()
	i := sharedIstiod(t)
	agent := istioagent.Start(t, withIstiodCA(i, istioagent.Options{
		DiscoveryAddress: r.addr, PodName: w.key.Name, PodNamespace: ns, InstanceIP: w.ip,
		ClusterID: certClusterID, ServiceAccount: fixtures.ServiceAccount, Token: w.token,
		ProxyConfig: &meshconfig.ProxyConfig{ReadinessProbe: group.GetProbe()},
	}))
	checkCertificate(t, agent, i, ns, fixtures.ServiceAccount)
	c, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	// pilot-agent reports health once its client asked for listeners.
	for _, typeURL := range []string{resource.ClusterType, resource.ListenerType} {
		if err := c.Send(typeURL, nil, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, w.key, connected("replica-h"))

	// Failing from the start: unhealthy with the probe's message, and it
	// stays so while the probe keeps failing.
	s := waitHealthStatus(t, w.key, metav1.ConditionFalse, agent)
	if msg := s.we.GetMessage(); !strings.Contains(msg, "503") {
		t.Errorf("unhealthy message = %q, want the probe's status 503", msg)
	}
	firstFail := s.we.GetLastTransitionTime().AsTime()
	if firstFail.Before(connectStart) || !s.we.GetLastProbeTime().AsTime().Equal(firstFail) {
		t.Errorf("first report: transition %v, probe %v, want equal and after %v", firstFail, s.we.GetLastProbeTime().AsTime(), connectStart)
	}
	probes := app.probes.Load()
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return app.probes.Load() >= probes+3, nil
	}); err != nil {
		t.Fatal("pilot-agent stopped probing")
	}
	if s := readHealth(t, w.key); s.we.GetStatus() != "False" || !s.we.GetLastTransitionTime().AsTime().Equal(firstFail) {
		t.Errorf("after more failing probes: %v, want still False since %v", s.we, firstFail)
	}

	// Healthy: a transition.
	turned := time.Now()
	app.healthy.Store(true)
	s = waitHealthStatus(t, w.key, metav1.ConditionTrue, agent)
	healthyAt := s.we.GetLastTransitionTime().AsTime()
	if healthyAt.Before(turned) || !s.we.GetLastProbeTime().AsTime().Equal(healthyAt) || s.we.GetMessage() != "" {
		t.Errorf("healthy: transition %v, probe %v, message %q; want equal, after %v, no message", healthyAt, s.we.GetLastProbeTime().AsTime(), s.we.GetMessage(), turned)
	}
	if !s.war.LastTransitionTime.Equal(&metav1.Time{Time: healthyAt.Truncate(time.Second)}) || s.war.Reason != runtimev1alpha1.ReasonProbeSucceeded {
		t.Errorf("registration Healthy = %+v, want ProbeSucceeded since %v", s.war, healthyAt)
	}

	// Unhealthy again.
	turned = time.Now()
	app.healthy.Store(false)
	s = waitHealthStatus(t, w.key, metav1.ConditionFalse, agent)
	if at := s.we.GetLastTransitionTime().AsTime(); at.Before(turned) || !strings.Contains(s.we.GetMessage(), "503") {
		t.Errorf("unhealthy again: transition %v (want after %v), message %q", at, turned, s.we.GetMessage())
	}
	if s.war.Reason != runtimev1alpha1.ReasonProbeFailed || !strings.Contains(s.war.Message, "503") {
		t.Errorf("registration Healthy = %+v, want ProbeFailed with the probe's message", s.war)
	}
	// kubectl get war -o wide shows it.
	out, err := env.Kubectl(t.Context(), nil, "get", "war", "-n", ns, "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header, row := columns(lines[0]), columns(lines[len(lines)-1])
	got := map[string]string{}
	for i, h := range header {
		if i < len(row) {
			got[h] = row[i]
		}
	}
	if got["AGENT CONNECTED"] != "True" || got["HEALTHY"] != "False" {
		t.Errorf("kubectl get war -o wide: AGENT CONNECTED %q, HEALTHY %q, want True and False:\n%s", got["AGENT CONNECTED"], got["HEALTHY"], out)
	}

	// On disconnect the condition stays as last known.
	last := readHealth(t, w.key)
	agent.Stop()
	waitState(t, w.key, disconnected("replica-h"))
	if s := readHealth(t, w.key); s.we.GetStatus() != last.we.GetStatus() || !s.we.GetLastProbeTime().AsTime().Equal(last.we.GetLastProbeTime().AsTime()) {
		t.Errorf("after disconnect: %v, want unchanged %v", s.we, last.we)
	}
	if n := histogramCount(t, metricsReg, "embark_registry_health_time_to_first_healthy_seconds"); n != 1 {
		t.Errorf("time-to-first-healthy observations = %d, want 1", n)
	}
}

// columns splits a kubectl table row (columns are at least two spaces apart).
func columns(line string) []string {
	var out []string
	for _, f := range strings.Split(line, "  ") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			var n uint64
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
			return n
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
