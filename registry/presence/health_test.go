package presence

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	istiometa "istio.io/api/meta/v1alpha1"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// healthHarness is a registered workload of a group with a probe, connected
// to replica "replica-a", and a HealthMirror.
type healthHarness struct {
	w      registry.StreamWorkload
	conns  *Connections
	mirror *HealthMirror
	reg    *prometheus.Registry
}

var healthHosts atomic.Int32

func startHealth(t *testing.T, damping time.Duration) *healthHarness {
	t.Helper()
	return startHealthWith(t, damping, nil)
}

// startHealthWith is startHealth with the mirror's client wrapped by wrap
// (nil: env.Client as it is).
func startHealthWith(t *testing.T, damping time.Duration, wrap func(client.Client) client.Client) *healthHarness {
	t.Helper()
	ip := fmt.Sprintf("172.31.9.%d", 10+healthHosts.Add(1))
	ns := env.Namespace(t)
	wg := fixtures.SeedGroup(ns)
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	wg.Spec.Probe = &istioapi.ReadinessProbe{
		PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1,
		HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Path: "/ready", Port: 8080}},
	}
	if err := env.Client.Update(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
	res, err := newRegistrar(t, nil).Write(t.Context(), registry.Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000b"), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	h := &healthHarness{w: registry.StreamWorkload{Key: client.ObjectKeyFromObject(res.Registration), UID: res.Registration.UID, Group: wg.Name}}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	h.conns, err = NewConnections(ctx, ConnectionOptions{Client: env.Client, Replica: "replica-a", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.reg = prometheus.NewRegistry()
	metrics, err := NewHealthMetrics(h.reg, cached)
	if err != nil {
		t.Fatal(err)
	}
	var mirrorClient client.Client = env.Client
	if wrap != nil {
		mirrorClient = wrap(env.Client)
	}
	h.mirror, err = NewHealthMirror(ctx, HealthOptions{
		Client: mirrorClient, Connections: h.conns, Damping: damping, Metrics: metrics, Logger: log,
		Retry: wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		h.conns.Wait()
		h.mirror.Wait()
	})
	h.conns.Opened(h.w, 1)
	waitObserved(t, h.w.Key, connectedTo("replica-a"))
	return h
}

// healthOf returns the WorkloadEntry's and the registration's Healthy
// conditions (nil when unset).
func healthOf(t *testing.T, key types.NamespacedName) (*istiometa.IstioCondition, *metav1.Condition) {
	t.Helper()
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), key, we); err != nil {
		t.Fatal(err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	return registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy), meta.FindStatusCondition(war.Status.Conditions, registry.ConditionHealthy)
}

// waitHealth waits until the WorkloadEntry's condition has probe time at
// and returns both conditions.
func waitHealth(t *testing.T, key types.NamespacedName, probedAt time.Time) (*istiometa.IstioCondition, *metav1.Condition) {
	t.Helper()
	var we *istiometa.IstioCondition
	var war *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		we, war = healthOf(t, key)
		return we != nil && war != nil && we.GetLastProbeTime().AsTime().Equal(probedAt) &&
			string(war.Status) == we.GetStatus() && war.LastTransitionTime.Equal(&metav1.Time{Time: we.GetLastTransitionTime().AsTime().Truncate(time.Second)}), nil
	})
	if err != nil {
		t.Fatalf("no Healthy condition probed at %v: WorkloadEntry %v, registration %v", probedAt, we, war)
	}
	return we, war
}

func checkHealth(t *testing.T, we *istiometa.IstioCondition, war *metav1.Condition, status metav1.ConditionStatus, transition time.Time, message string) {
	t.Helper()
	if we.GetStatus() != string(status) || we.GetMessage() != message || !we.GetLastTransitionTime().AsTime().Equal(transition) {
		t.Errorf("WorkloadEntry Healthy = %s %q transition %v, want %s %q transition %v",
			we.GetStatus(), we.GetMessage(), we.GetLastTransitionTime().AsTime(), status, message, transition)
	}
	if war.Status != status || !war.LastTransitionTime.Equal(&metav1.Time{Time: transition.Truncate(time.Second)}) || (message != "" && !strings.Contains(war.Message, message)) {
		t.Errorf("registration Healthy = %s %q transition %v, want %s with %q transition %v",
			war.Status, war.Message, war.LastTransitionTime, status, message, transition.Truncate(time.Second))
	}
}

func TestHealthConditionFollowsReports(t *testing.T) {
	h := startHealth(t, -1)
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), h.w.Key, we); err != nil {
		t.Fatal(err)
	}
	if got := we.Annotations[registry.AnnotationHealthChecksEnabled]; got != "true" {
		t.Errorf("annotation %s = %q, want true for a group with a probe", registry.AnnotationHealthChecksEnabled, got)
	}
	if got := WorkloadEntryHealth(we); got != healthUnhealthy {
		t.Errorf("health before any report = %s, want unhealthy", got)
	}

	base := time.Now().UTC().Truncate(time.Millisecond)
	t1, t2, t3, t4 := base, base.Add(2*time.Second), base.Add(4*time.Second), base.Add(6*time.Second)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: false, Message: "HTTP probe failed with statuscode: 503", At: t1})
	c, r := waitHealth(t, h.w.Key, t1)
	checkHealth(t, c, r, metav1.ConditionFalse, t1, "HTTP probe failed with statuscode: 503")

	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: t2})
	c, r = waitHealth(t, h.w.Key, t2)
	checkHealth(t, c, r, metav1.ConditionTrue, t2, "")

	// The same status again: a new probe time, the transition stays.
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: t3})
	c, r = waitHealth(t, h.w.Key, t3)
	checkHealth(t, c, r, metav1.ConditionTrue, t2, "")

	// On disconnect the condition stays; the replica still holds the
	// connection in the stored status, so a late report is still stored.
	h.conns.Closed(h.w, 1)
	waitObserved(t, h.w.Key, disconnectedFrom("replica-a"))
	c, r = healthOf(t, h.w.Key)
	checkHealth(t, c, r, metav1.ConditionTrue, t2, "")
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: false, Message: "connection refused", At: t4})
	c, r = waitHealth(t, h.w.Key, t4)
	checkHealth(t, c, r, metav1.ConditionFalse, t4, "connection refused")

	if err := env.Client.Get(t.Context(), h.w.Key, we); err != nil {
		t.Fatal(err)
	}
	if got := WorkloadEntryHealth(we); got != healthUnhealthy {
		t.Errorf("health = %s, want unhealthy", got)
	}
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, h.reg, "embark_registry_health_writes_total", "stored"); got != 4 {
		t.Errorf("stored writes = %v, want 4", got)
	}
	// The workloads gauge counts from the informer cache.
	var got map[string]float64
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got = workloadsGauge(t, h.reg, h.w.Key.Namespace)
		return len(got) == 1 && got["ratings/unhealthy"] == 1, nil
	})
	if err != nil {
		t.Errorf("embark_registry_workloads of %s = %v, want ratings/unhealthy 1", h.w.Key.Namespace, got)
	}
}

// workloadsGauge returns embark_registry_workloads of namespace ns by
// "group/health".
func workloadsGauge(t *testing.T, reg *prometheus.Registry, ns string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "embark_registry_workloads" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l[WorkloadNamespaceLabel] == ns {
				out[l["group"]+"/"+l["health"]] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func TestHealthOfAnotherReplicasWorkloadIsNotWritten(t *testing.T) {
	h := startHealth(t, -1)
	// Replica b takes the workload over; a's stream is gone.
	h.conns.Closed(h.w, 1)
	waitObserved(t, h.w.Key, disconnectedFrom("replica-a"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b := newConnections(t, ctx, "replica-b", nil)
	b.Opened(h.w, 7)
	waitObserved(t, h.w.Key, connectedTo("replica-b"))

	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: time.Now()})
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c, r := healthOf(t, h.w.Key); c != nil || r != nil {
		t.Errorf("replica a wrote the health of replica b's workload: %v / %v", c, r)
	}
	if got := counterValue(t, h.reg, "embark_registry_health_writes_total", "dropped"); got != 1 {
		t.Errorf("dropped reports = %v, want 1", got)
	}
}

func TestHealthFlappingIsDampedAgainstTheAPIServer(t *testing.T) {
	h := startHealth(t, time.Hour)
	t1 := time.Now().UTC().Truncate(time.Millisecond)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: t1})
	waitHealth(t, h.w.Key, t1)
	// A flip one second later is held (for an hour); the flip back agrees
	// with the stored status and is stored at once, so the failure in
	// between never shows.
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: false, Message: "flap", At: t1.Add(time.Second)})
	t3 := t1.Add(2 * time.Second)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: t3})
	c, r := waitHealth(t, h.w.Key, t3)
	checkHealth(t, c, r, metav1.ConditionTrue, t1, "")
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A lasting change is stored once it has lasted the window (2s here);
	// its transition time is when it began.
	h2 := startHealth(t, 2*time.Second)
	s1 := time.Now().UTC().Truncate(time.Millisecond)
	h2.mirror.ReportHealth(t.Context(), h2.w, registry.HealthReport{Healthy: true, At: s1})
	waitHealth(t, h2.w.Key, s1)
	s2 := s1.Add(100 * time.Millisecond)
	h2.mirror.ReportHealth(t.Context(), h2.w, registry.HealthReport{Healthy: false, Message: "down", At: s2})
	c, r = waitHealth(t, h2.w.Key, s2)
	checkHealth(t, c, r, metav1.ConditionFalse, s2, "down")
}

// A flip superseded by a contrary report while it is being stored is not
// written: the damping decision is the newer report's (steady again), so
// writing the older flip would let a flap through undamped, and the flip
// back would then be held for the whole window.
func TestHealthFlipSupersededWhileStoredIsNotWritten(t *testing.T) {
	var h *healthHarness
	var armed atomic.Bool
	var t3 time.Time
	h = startHealthWith(t, time.Hour, func(c client.Client) client.Client {
		return interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*istionetworkingv1.WorkloadEntry); ok && armed.CompareAndSwap(true, false) {
					// The flip's store is under way: the flip back arrives.
					h.mirror.ReportHealth(ctx, h.w, registry.HealthReport{Healthy: true, At: t3})
				}
				return c.Get(ctx, key, obj, opts...)
			},
		})
	})
	t1 := time.Now().UTC().Truncate(time.Millisecond)
	t3 = t1.Add(2 * time.Second)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: t1})
	waitHealth(t, h.w.Key, t1)
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: false, Message: "flap", At: t1.Add(time.Second)})
	c, r := waitHealth(t, h.w.Key, t3)
	checkHealth(t, c, r, metav1.ConditionTrue, t1, "")
	if armed.Load() {
		t.Fatal("the flip's store never read the WorkloadEntry")
	}
}

// TestHealthWriteRetriedUntilStored blocks writes of WorkloadEntry status in
// the test's namespace with a ValidatingAdmissionPolicy (a real refusal by
// the API server), reports health, and lifts the block: the report is stored.
func TestHealthWriteRetriedUntilStored(t *testing.T) {
	h := startHealth(t, -1)
	ns := h.w.Key.Namespace
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "block-health-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{
						APIGroups: []string{"networking.istio.io"}, APIVersions: []string{"*"}, Resources: []string{"workloadentries/status"},
					},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "health writes blocked by the test"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: policy.Name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	// Wait until the API server enforces it (a dry-run status write is refused).
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		we := &istionetworkingv1.WorkloadEntry{}
		if err := env.Client.Get(ctx, h.w.Key, we); err != nil {
			return false, err
		}
		we.Status.Conditions = []*istiometa.IstioCondition{{Type: "Probe", Status: "True"}}
		err := env.Client.Status().Update(ctx, we, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "health writes blocked"), nil
	})
	if err != nil {
		t.Fatalf("the admission policy never took effect: %v", err)
	}

	at := time.Now().UTC().Truncate(time.Millisecond)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: at})
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return counterValue(t, h.reg, "embark_registry_health_writes_total", "retried") >= 2, nil
	})
	if err != nil {
		t.Fatal("no failed write was retried")
	}
	if c, _ := healthOf(t, h.w.Key); c != nil {
		t.Fatalf("condition stored through the block: %v", c)
	}
	if err := env.Client.Delete(t.Context(), binding); err != nil {
		t.Fatal(err)
	}
	c, r := waitHealth(t, h.w.Key, at)
	checkHealth(t, c, r, metav1.ConditionTrue, at, "")
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// The mirror keeps no per-workload state once the workload's last stream on
// the replica closed: neither from reports stored while it was connected
// nor from a late report (the soak churns thousands of workloads through
// one endpoint).
func TestHealthStateDroppedAfterDisconnect(t *testing.T) {
	h := startHealth(t, -1)
	base := time.Now().UTC().Truncate(time.Millisecond)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: base})
	waitHealth(t, h.w.Key, base)
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := h.mirror.tracked(); got != 1 {
		t.Errorf("workloads tracked while connected = %d, want 1", got)
	}

	h.conns.Closed(h.w, 1)
	if got := h.mirror.tracked(); got != 0 {
		t.Errorf("workloads tracked after the last stream closed = %d, want 0", got)
	}

	late := base.Add(2 * time.Second)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: false, Message: "connection refused", At: late})
	waitHealth(t, h.w.Key, late)
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := h.mirror.tracked(); got != 0 {
		t.Errorf("workloads tracked after a late report was stored = %d, want 0", got)
	}
}
