package presence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"
	istiometa "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// HealthOptions configures a HealthMirror. Every field documents its default.
type HealthOptions struct {
	// Client reads registrations and WorkloadEntries fresh from the API
	// server (writes use their resourceVersion) and writes their status.
	// Required.
	Client client.Client
	// Connections tells which workloads hold streams to this replica and
	// names the replica; only the replica holding a workload's stream (or
	// named as its connection's holder) writes its health. Required.
	Connections *Connections
	// Damping is the window of the flapping rule (see docs/health.md): a flip
	// of a workload whose reports changed status less than Damping before is
	// held until it has lasted Damping. Default DefaultHealthDamping; a
	// negative value disables damping.
	Damping time.Duration
	// Writer is the replica's write budget, shared with every component
	// that writes (write.Writer). Default: a Writer of its own with
	// write.Options' defaults.
	Writer *write.Writer
	// Retry is the backoff between attempts of a report that could not be
	// stored; it is retried until stored, superseded by a newer report, or
	// the mirror stops. Default: 100ms doubling, capped at 10s.
	Retry wait.Backoff
	// Metrics. Default: not recorded.
	Metrics *HealthMetrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Clock. Default time.Now.
	Clock func() time.Time
}

// HealthMirror writes the health reports of this replica's workloads to the
// Healthy condition of their WorkloadEntry (status.conditions, with
// lastProbeTime and lastTransitionTime, as istiod reads it) and of their
// WorkloadAutoRegistration.
//
// ReportHealth never blocks: each workload keeps its latest report, which a
// goroutine of its own stores with optimistic concurrency, retrying with
// backoff until it is stored or a newer report replaces it. Flips of flapping
// workloads are damped (see damper). On disconnect the condition stays as it
// was last stored until the connection tracker takes the workload out of
// traffic (Healthy False, reason AgentDisconnected, when it does not come
// back in time); a report of a stream closed before that is not stored over
// it.
type HealthMirror struct {
	ctx     context.Context
	client  client.Client
	conns   *Connections
	writer  *write.Writer
	retry   wait.Backoff
	damping time.Duration
	metrics *HealthMetrics
	log     *slog.Logger
	now     func() time.Time

	mu      sync.Mutex
	entries map[types.NamespacedName]*healthEntry
	queue   *latest[*healthEntry, registry.HealthReport] // guarded by mu
}

// healthEntry is one workload's health as this replica knows it.
type healthEntry struct {
	workload registry.StreamWorkload
	damp     damper
	slot     slot[registry.HealthReport] // the latest report, not stored yet
	// firstHealthyFor is the connection (its connectedAt) whose first
	// healthy report was measured.
	firstHealthyFor time.Time
}

// NewHealthMirror returns a mirror whose writes run until ctx ends.
func NewHealthMirror(ctx context.Context, opts HealthOptions) (*HealthMirror, error) {
	if opts.Client == nil || opts.Connections == nil {
		return nil, errors.New("registry: Client and Connections are required")
	}
	if opts.Damping == 0 {
		opts.Damping = DefaultHealthDamping
	}
	if opts.Retry.Steps <= 0 {
		opts.Retry = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 10 * time.Second}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	m := &HealthMirror{
		ctx: ctx, client: opts.Client, conns: opts.Connections, writer: write.OrDefault(opts.Writer),
		retry: opts.Retry, damping: opts.Damping, metrics: opts.Metrics, log: opts.Logger, now: opts.Clock,
		entries: map[types.NamespacedName]*healthEntry{},
	}
	m.queue = &latest[*healthEntry, registry.HealthReport]{ctx: ctx, mu: &m.mu, retry: opts.Retry, store: m.storeOnce, retrying: m.retrying, ended: m.ended}
	opts.Connections.onIdle(m.disconnected)
	return m, nil
}

// disconnected drops what the mirror keeps of w (its damping state) when
// w's last stream on this replica closed, unless a report is being
// stored: then drain drops it once done. A reconnecting workload starts
// with fresh damping.
func (m *HealthMirror) disconnected(w registry.StreamWorkload) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[w.Key]; e != nil && !e.slot.running && e.workload.UID == w.UID {
		delete(m.entries, w.Key)
	}
}

// tracked returns the number of workloads the mirror keeps state for.
func (m *HealthMirror) tracked() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// ReportHealth records a health report of workload w. It never blocks.
func (m *HealthMirror) ReportHealth(_ context.Context, w registry.StreamWorkload, h registry.HealthReport) {
	if h.At.IsZero() {
		h.At = m.now()
	}
	h.Message = healthMessage(h.Message)
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[w.Key]
	if e == nil || e.workload.UID != w.UID {
		if e != nil && e.slot.running {
			e.workload = w // its writer drops the old registration's report
			e.damp = damper{window: m.damping}
		} else {
			e = &healthEntry{workload: w, damp: damper{window: m.damping}, slot: newSlot[registry.HealthReport]()}
			m.entries[w.Key] = e
		}
	}
	e.damp.observe(h)
	m.queue.putLocked(e, &e.slot, &h)
}

// Flush waits until every report is stored or dropped (a report held by
// damping is still pending), or ctx ends.
func (m *HealthMirror) Flush(ctx context.Context) error {
	return write.WaitIdle(ctx, "health reports", m.queue.busy)
}

// Wait waits for every writer goroutine to end; call it after the mirror's
// context ended.
func (m *HealthMirror) Wait() { m.queue.wait() }

// ended forgets e when its writer ended (mu held) and the workload has no
// stream here any more (a late report, or one stored while its last stream
// closed), or e's state was dropped (the registration is gone or not ours).
func (m *HealthMirror) ended(e *healthEntry) {
	idle := m.conns.Streams(e.workload.Key) == 0
	if (idle || !e.damp.known) && m.entries[e.workload.Key] == e {
		delete(m.entries, e.workload.Key)
	}
}

var (
	errNotHolder = errors.New("another replica holds the workload's stream")
	errNoEntry   = errors.New("the registration has no WorkloadEntry")
	// errSuperseded: a contrary report came while this one was stored; the
	// newer one is pending and stored instead.
	errSuperseded = errors.New("superseded by a newer contrary report")
)

// heldUntil is returned by store when damping holds the report.
type heldUntil struct{ at time.Time }

func (h heldUntil) Error() string { return "held by damping until " + h.at.Format(time.RFC3339Nano) }

// storeOnce stores h once (the latest queue's store): done when it is
// stored or dropped (the registration is gone or held by another replica);
// a hold while damping holds it; an error to retry.
func (m *HealthMirror) storeOnce(e *healthEntry, h *registry.HealthReport) (time.Duration, error) {
	m.mu.Lock()
	w := e.workload
	m.mu.Unlock()
	err := m.store(e, w, h)
	var held heldUntil
	switch {
	case err == nil || errors.Is(err, errSuperseded):
		return 0, nil
	case errors.As(err, &held):
		return max(held.at.Sub(m.now()), time.Millisecond), nil
	case apierrors.IsNotFound(err) || errors.Is(err, errRegistrationReplaced) || errors.Is(err, errNotHolder) || errors.Is(err, errNoEntry):
		m.log.Debug("health report not stored", "registration", w.Key.String(), "reason", err.Error())
		m.metrics.dropped()
		m.forget(e)
		return 0, nil
	default:
		return 0, err
	}
}

// retrying counts and logs a report whose store failed and is retried.
func (m *HealthMirror) retrying(e *healthEntry, h *registry.HealthReport, err error, in time.Duration) {
	m.mu.Lock()
	key := e.workload.Key
	m.mu.Unlock()
	m.metrics.failed()
	m.log.Error("store health report; retrying", "registration", key.String(), "healthy", h.Healthy, "retryIn", in, "error", err)
}

// forget drops what is known of e's workload unless a newer report came.
func (m *HealthMirror) forget(e *healthEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[e.workload.Key] == e {
		e.damp = damper{window: m.damping}
	}
}

// store writes h to the WorkloadEntry's and the registration's Healthy
// condition, unless damping holds it.
func (m *HealthMirror) store(e *healthEntry, w registry.StreamWorkload, h *registry.HealthReport) error {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := m.client.Get(m.ctx, w.Key, war); err != nil {
		return fmt.Errorf("read registration %s: %w", w.Key, err)
	}
	if w.UID != "" && war.UID != w.UID {
		return errRegistrationReplaced
	}
	conn := war.Status.Connection
	if m.conns.Streams(w.Key) == 0 && (conn == nil || conn.Replica != m.conns.Replica()) {
		return errNotHolder
	}
	var transitioned bool
	var prev *istiometa.IstioCondition
	var stored *istiometa.IstioCondition
	err := m.writer.Do(m.ctx, func(ctx context.Context) error {
		we := &istionetworkingv1.WorkloadEntry{}
		if err := m.client.Get(ctx, w.Key, we); err != nil {
			if apierrors.IsNotFound(err) {
				return errNoEntry
			}
			return err
		}
		if ref, ok := registry.OwnedBy(we.OwnerReferences, w.Key.Name); !ok || (w.UID != "" && ref.UID != w.UID) {
			return errNoEntry
		}
		if takenOutOfTraffic(we) && m.conns.Streams(w.Key) == 0 {
			// A report of a stream closed since (held by damping, or
			// retried) must not put back in traffic a workload taken out
			// because it did not reconnect.
			return errNotHolder
		}
		prev = registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
		m.mu.Lock()
		// The damping decision is the latest report's: a contrary report
		// that came while h was being stored supersedes h (it is pending and
		// stored next), so h, judged by the newer report's run, must not
		// slip through undamped.
		superseded := e.damp.known && e.damp.status != h.Healthy
		due := e.damp.due(prev != nil, prev != nil && prev.GetStatus() == string(metav1.ConditionTrue))
		m.mu.Unlock()
		if superseded {
			return errSuperseded
		}
		if !due.IsZero() && due.After(m.now()) {
			return heldUntil{due}
		}
		want := healthCondition(prev, h)
		stored = want
		transitioned = prev == nil || prev.GetStatus() != want.GetStatus()
		if prev != nil && prev.GetStatus() == want.GetStatus() && prev.GetMessage() == want.GetMessage() &&
			prev.GetReason() == want.GetReason() && !prev.GetLastProbeTime().AsTime().Before(h.At) {
			return nil // already stored (a retry), or a newer report was
		}
		we.Status.Conditions = registry.SetIstioCondition(we.Status.Conditions, want)
		return m.client.Status().Update(ctx, we)
	})
	if err != nil {
		var held heldUntil
		if errors.As(err, &held) || errors.Is(err, errNoEntry) || errors.Is(err, errSuperseded) {
			return err
		}
		return fmt.Errorf("write Healthy condition of WorkloadEntry %s: %w", w.Key, err)
	}
	if err := m.storeRegistration(w, stored); err != nil {
		return err
	}
	m.metrics.stored()
	if h.Healthy && conn != nil && conn.ConnectedAt != nil {
		m.mu.Lock()
		first := !e.firstHealthyFor.Equal(conn.ConnectedAt.Time)
		e.firstHealthyFor = conn.ConnectedAt.Time
		m.mu.Unlock()
		if d := h.At.Sub(conn.ConnectedAt.Time); first && d >= 0 {
			m.metrics.firstHealthy(d)
		}
	}
	if transitioned {
		m.log.Info("workload health changed", "registration", w.Key.String(), "healthy", h.Healthy, "message", h.Message)
	}
	return nil
}

// storeRegistration writes the registration's Healthy condition to match
// the WorkloadEntry's.
func (m *HealthMirror) storeRegistration(w registry.StreamWorkload, we *istiometa.IstioCondition) error {
	err := m.writer.Do(m.ctx, func(ctx context.Context) error {
		cur := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := m.client.Get(ctx, w.Key, cur); err != nil {
			return err
		}
		if w.UID != "" && cur.UID != w.UID {
			return errRegistrationReplaced
		}
		cond := metav1.Condition{
			Type: registry.ConditionHealthy, Status: metav1.ConditionStatus(we.GetStatus()), Reason: we.GetReason(),
			Message:            registrationHealthMessage(we),
			LastTransitionTime: metav1.NewTime(we.GetLastTransitionTime().AsTime()), ObservedGeneration: cur.Generation,
		}
		// SetStatusCondition takes cond's time only when the status flips.
		if !meta.SetStatusCondition(&cur.Status.Conditions, cond) {
			return nil
		}
		return m.client.Status().Update(ctx, cur)
	})
	if err != nil {
		return fmt.Errorf("write Healthy condition of registration %s: %w", w.Key, err)
	}
	return nil
}

// registrationHealthMessage is the registration's condition message.
func registrationHealthMessage(c *istiometa.IstioCondition) string {
	if c.GetStatus() == string(metav1.ConditionTrue) {
		return "the readiness probe passes (reported " + c.GetLastProbeTime().AsTime().UTC().Format(time.RFC3339) + ")"
	}
	msg := c.GetMessage()
	if msg == "" {
		msg = "no detail"
	}
	return "the readiness probe fails: " + msg
}

// healthCondition is the WorkloadEntry condition for report h, given the one
// stored (prev, may be nil): lastTransitionTime moves only when the status
// flips.
func healthCondition(prev *istiometa.IstioCondition, h *registry.HealthReport) *istiometa.IstioCondition {
	c := &istiometa.IstioCondition{
		Type:          registry.ConditionHealthy,
		Status:        string(metav1.ConditionFalse),
		Reason:        runtimev1alpha1.ReasonProbeFailed,
		Message:       h.Message,
		LastProbeTime: timestamppb.New(h.At),
	}
	if h.Healthy {
		c.Status, c.Reason, c.Message = string(metav1.ConditionTrue), runtimev1alpha1.ReasonProbeSucceeded, ""
	}
	c.LastTransitionTime = timestamppb.New(h.At)
	if prev != nil && prev.GetStatus() == c.Status && prev.GetLastTransitionTime() != nil {
		c.LastTransitionTime = prev.GetLastTransitionTime()
	}
	return c
}

// MaxHealthMessage bounds the probe message stored in a condition (the
// sidecar's error detail is outside input; metav1.Condition allows 32768).
const MaxHealthMessage = 1024

// healthMessage is msg as stored: valid UTF-8, at most MaxHealthMessage
// bytes, cut at a rune boundary with "..." when longer.
func healthMessage(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	if len(msg) <= MaxHealthMessage {
		return msg
	}
	cut := MaxHealthMessage - len("...")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "..."
}
