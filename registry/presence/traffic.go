package presence

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	istiometa "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// DefaultOutOfTrafficAfter is ConnectionOptions.OutOfTrafficAfter's default:
// Istio's own auto-registration removes a disconnected workload's entry
// after its clean-up grace of 10s (PILOT_WORKLOAD_ENTRY_GRACE_PERIOD).
const DefaultOutOfTrafficAfter = 10 * time.Second

// outTimer is a pending "out of traffic" decision of one workload whose
// disconnect this replica stored: a runtime timer (no goroutine) that, when
// it fires, queues the decision on the workload's writer.
type outTimer struct {
	st *connState // the stored disconnect
	t  *time.Timer
}

// Drain marks the replica as shutting down: the pending out-of-traffic
// timers are stopped and the streams closing from now on (the replica
// closes them itself; their sidecars reconnect to another replica) start
// none. Call it before closing the xDS server's streams.
func (c *Connections) Drain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = true
	for key, ot := range c.outTimers {
		ot.t.Stop()
		delete(c.outTimers, key)
	}
}

// HandOver marks the replica as handing its workloads over to the other
// replicas as it shuts down: the streams closing from now on write no
// disconnect (nor start an out-of-traffic timer), so a workload whose
// sidecar reconnects to another replica, which stores that connection, gets
// no AgentConnected transition at all, however long the other replica takes
// to store it. The caller keeps this replica's Lease (does not release it):
// a workload that reconnects nowhere is marked gone (ReplicaGone) by the
// sweeper once that Lease expires. Call it, with Drain, before closing the
// xDS server's streams, and only while another replica is alive.
func (c *Connections) HandOver() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handingOver = true
}

// pendingOutOfTraffic returns how many out-of-traffic timers are pending.
func (c *Connections) pendingOutOfTraffic() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.outTimers)
}

// startOutOfTraffic starts the out-of-traffic timer of st, a disconnect
// this replica just stored, due OutOfTrafficAfter after the stream closed.
// A draining or stopped tracker, a workload that has a stream here again,
// or a disabled delay starts none.
func (c *Connections) startOutOfTraffic(st *connState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := st.workload.Key
	if c.outAfter <= 0 || c.draining || c.ctx.Err() != nil {
		return
	}
	if e := c.entries[key]; e != nil && len(e.streams) > 0 {
		return
	}
	c.cancelOutOfTrafficLocked(key)
	ot := &outTimer{st: st}
	// The callback takes mu first, so it sees ot.t set even when it fires
	// at once.
	ot.t = time.AfterFunc(time.Until(st.closed.Add(c.outAfter)), func() { c.outOfTrafficDue(ot) })
	c.outTimers[key] = ot
}

// cancelOutOfTrafficLocked stops the workload's pending timer (mu held).
func (c *Connections) cancelOutOfTrafficLocked(key types.NamespacedName) {
	if ot := c.outTimers[key]; ot != nil {
		ot.t.Stop()
		delete(c.outTimers, key)
	}
}

// outOfTrafficDue queues the out-of-traffic decision of ot's workload on
// its writer, unless the timer was replaced or cancelled, the replica
// drains, the workload has a stream here again or a newer state is
// pending (a connect).
func (c *Connections) outOfTrafficDue(ot *outTimer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := ot.st.workload
	if c.outTimers[w.Key] != ot {
		return
	}
	delete(c.outTimers, w.Key)
	if c.draining || c.ctx.Err() != nil {
		return
	}
	e := c.entries[w.Key]
	switch {
	case e == nil:
		e = &connEntry{workload: w, slot: newSlot[connState]()}
		c.entries[w.Key] = e
	case len(e.streams) > 0 || e.slot.pending != nil || e.workload.UID != w.UID:
		return
	}
	out := *ot.st
	out.outOfTraffic = true
	c.enqueueLocked(e, &out)
}

// storeOutOfTraffic takes the workload's WorkloadEntry out of traffic with
// one write, when the workload is still disconnected from this replica (the
// stored status shows this replica's disconnect and no connection since;
// no stream here; no health report since the disconnect, which only a new
// stream elsewhere sends) and the entry is in traffic:
//
//   - an entry with proxy.istio.io/health-checks-enabled (a group with a
//     probe) gets its Healthy condition False, reason AgentDisconnected;
//   - an entry without it (no probe) gets that annotation and
//     onboarding.tetrate.io/out-of-traffic: istiod then routes to it only
//     while a Healthy condition is True, and it has none.
//
// The entry is read and written with its resourceVersion, so a connect
// stored by another replica in between (which writes the entry's
// connection annotations) makes the write conflict and the decision is
// taken again on what is stored then.
func (c *Connections) storeOutOfTraffic(st *connState) error {
	if c.reconnectedInCache(st) {
		return nil
	}
	key := st.workload.Key
	took := false
	err := c.writer.Do(c.ctx, func(ctx context.Context) error {
		took = false
		we := &istionetworkingv1.WorkloadEntry{}
		if err := c.client.Get(ctx, key, we); err != nil {
			return err
		}
		if ref, ok := registry.OwnedBy(we.OwnerReferences, key.Name); !ok || (st.workload.UID != "" && ref.UID != st.workload.UID) {
			return nil
		}
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := c.client.Get(ctx, key, war); err != nil {
			return err
		}
		if !c.stillDisconnected(war, st) || reportedSince(we, st.disconnectedAt) {
			return nil
		}
		healthy := healthyCondition(we)
		if !healthChecksEnabled(we) {
			ann := registry.WithoutIstiodAnnotations(we.Annotations)
			if ann == nil {
				ann = map[string]string{}
			}
			ann[registry.AnnotationHealthChecksEnabled] = "true"
			ann[registry.AnnotationOutOfTraffic] = runtimev1alpha1.ReasonAgentDisconnected
			we.Annotations = ann
			if err := c.client.Update(ctx, we); err != nil {
				return err
			}
			took = true
			if healthy == nil || healthy.GetStatus() != string(metav1.ConditionTrue) {
				return nil
			}
			// A sidecar of a group without a probe reported health
			// itself: its Healthy condition must go False as well.
		} else if healthy == nil || healthy.GetStatus() != string(metav1.ConditionTrue) {
			return nil // out of traffic already (unhealthy, or never probed)
		}
		we.Status.Conditions = registry.SetIstioCondition(we.Status.Conditions, c.disconnectedCondition(healthy, st))
		if err := c.client.Status().Update(ctx, we); err != nil {
			return err
		}
		took = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("take WorkloadEntry %s out of traffic: %w", key, err)
	}
	if took {
		c.metrics.tookOutOfTraffic()
		c.log.Info("workload taken out of traffic: its sidecar did not reconnect", "registration", key.String(),
			"disconnectedAt", st.disconnectedAt.UTC().Format(time.RFC3339), "after", c.outAfter.String())
	}
	return nil
}

// reconnectedInCache reports whether the cached registration shows a
// connection by another replica made after st's disconnect: a cache that
// lags shows an older state, never such a newer one, so the decision needs
// no read from the API server.
func (c *Connections) reconnectedInCache(st *connState) bool {
	if c.cache == nil {
		return false
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := c.cache.Get(c.ctx, st.workload.Key, war); err != nil || war.UID != st.workload.UID {
		return false
	}
	conn := war.Status.Connection
	return conn != nil && conn.Replica != c.replica && conn.ConnectedAt != nil &&
		!conn.ConnectedAt.Time.Before(st.disconnectedAt.Truncate(time.Second))
}

// stillDisconnected reports whether war still shows st's disconnect: this
// replica's, stored as AgentDisconnected, with no connection since, and no
// stream of the workload open here.
func (c *Connections) stillDisconnected(war *runtimev1alpha1.WorkloadAutoRegistration, st *connState) bool {
	if (st.workload.UID != "" && war.UID != st.workload.UID) || war.DeletionTimestamp != nil || c.Streams(st.workload.Key) > 0 {
		return false
	}
	conn := war.Status.Connection
	cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	return conn != nil && conn.Replica == c.replica && conn.DisconnectedAt != nil &&
		cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == runtimev1alpha1.ReasonAgentDisconnected
}

// disconnectedCondition is the Healthy condition of an entry taken out of
// traffic; prev is the one stored (its lastProbeTime is kept: no probe ran).
func (c *Connections) disconnectedCondition(prev *istiometa.IstioCondition, st *connState) *istiometa.IstioCondition {
	now := c.now()
	cond := &istiometa.IstioCondition{
		Type:   registry.ConditionHealthy,
		Status: string(metav1.ConditionFalse),
		Reason: runtimev1alpha1.ReasonAgentDisconnected,
		Message: fmt.Sprintf("out of traffic: the sidecar's last ADS stream to replica %s closed at %s and did not come back within %s",
			c.replica, st.disconnectedAt.UTC().Format(time.RFC3339), c.outAfter),
		LastTransitionTime: timestamppb.New(now),
		LastProbeTime:      timestamppb.New(now),
	}
	if prev != nil && prev.GetLastProbeTime() != nil {
		cond.LastProbeTime = prev.GetLastProbeTime()
	}
	return cond
}

// healthChecksEnabled reports whether istiod routes to we only while its
// Healthy condition is True (as istiod parses the annotation).
func healthChecksEnabled(we *istionetworkingv1.WorkloadEntry) bool {
	on, err := strconv.ParseBool(we.Annotations[registry.AnnotationHealthChecksEnabled])
	return err == nil && on
}

// healthyCondition returns we's Healthy condition, or nil.
func healthyCondition(we *istionetworkingv1.WorkloadEntry) *istiometa.IstioCondition {
	return registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
}

// reportedSince reports whether we's Healthy condition holds a health
// report made after t: only a stream opened since (on another replica)
// sends one, so the workload is back.
func reportedSince(we *istionetworkingv1.WorkloadEntry, t time.Time) bool {
	c := healthyCondition(we)
	return c != nil && c.GetReason() != runtimev1alpha1.ReasonAgentDisconnected &&
		c.GetLastProbeTime() != nil && c.GetLastProbeTime().AsTime().After(t)
}

// takenOutOfTraffic reports whether we was taken out of traffic because its
// workload's sidecar stayed disconnected.
func takenOutOfTraffic(we *istionetworkingv1.WorkloadEntry) bool {
	if we.Annotations[registry.AnnotationOutOfTraffic] != "" {
		return true
	}
	c := healthyCondition(we)
	return c != nil && c.GetReason() == runtimev1alpha1.ReasonAgentDisconnected
}

// backInTraffic removes from ann, the annotations a connect writes on an
// entry, the out-of-traffic mark and the health-checks annotation written
// with it. An entry taken out through its
// Healthy condition (a group with a probe) goes back with the probe's
// next report, which the sidecar sends on every new stream.
func backInTraffic(ann map[string]string) {
	if _, ok := ann[registry.AnnotationOutOfTraffic]; ok {
		delete(ann, registry.AnnotationOutOfTraffic)
		delete(ann, registry.AnnotationHealthChecksEnabled)
	}
}
