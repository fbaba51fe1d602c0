package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/internal/loop"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/lifecycle"
)

// Defaults of Options and of a WorkloadGroupRollout's spec.
const (
	DefaultMaxUnavailable          = 1
	DefaultProgressDeadlineSeconds = 600
	DefaultRecheckInterval         = 2 * time.Second
	DefaultAskQPS                  = 10.0
)

// Options configures a Controller. Every field documents its default.
type Options struct {
	// Client writes rollouts and deletes registrations. Required.
	Client client.Client
	// Cache is the informer cache rollouts, registrations and
	// WorkloadGroups are read from. Required.
	Cache cache.Cache
	// Recorder records Events on rollouts and registrations. Default: none.
	Recorder record.EventRecorder
	// RecheckInterval is how often a rollout with a batch in progress is
	// looked at again besides on changes (its deadline). Default 2s.
	RecheckInterval time.Duration
	// AskQPS bounds how many workloads per second are asked to onboard
	// again. Default 10.
	AskQPS float64
	// Logger. Default: slog.Default().
	Logger *slog.Logger
	// Clock. Default: time.Now.
	Clock func() time.Time
}

func (o *Options) setDefaults() error {
	if o.Client == nil || o.Cache == nil {
		return errors.New("rollout: Options.Client and Cache are required")
	}
	if o.Recorder == nil {
		o.Recorder = registry.NoEvents{}
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = DefaultRecheckInterval
	}
	if o.AskQPS <= 0 {
		o.AskQPS = DefaultAskQPS
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return nil
}

// Controller drives WorkloadGroupRollouts. Run it only while leading (the
// sweeper election): lifecycle.Options.Leading.
type Controller struct {
	opts Options
	asks *rate.Limiter
	log  *slog.Logger
	loop *loop.Loop
}

// New returns a Controller.
func New(opts Options) (*Controller, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Controller{opts: opts, asks: rate.NewLimiter(rate.Limit(opts.AskQPS), 1), log: opts.Logger.With("component", "rollout")}, nil
}

// Run reconciles rollouts until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.loop = loop.New(c.process, loop.Options{Name: "reconcile rollout", KeyName: "rollout", Logger: c.log})
	defer c.loop.ShutDown()
	watch := func(obj client.Object, keys func(any) []types.NamespacedName) error {
		add := func(o any) {
			for _, k := range keys(o) {
				c.loop.Add(k)
			}
		}
		return c.loop.Watch(ctx, c.opts.Cache, obj, toolscache.ResourceEventHandlerFuncs{
			AddFunc: add, UpdateFunc: func(_, o any) { add(o) },
			DeleteFunc: func(o any) {
				if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
					o = t.Obj
				}
				add(o)
			},
		})
	}
	self := func(o any) []types.NamespacedName {
		if obj, ok := o.(client.Object); ok {
			return []types.NamespacedName{client.ObjectKeyFromObject(obj)}
		}
		return nil
	}
	if err := watch(&runtimev1alpha1.WorkloadGroupRollout{}, self); err != nil {
		return err
	}
	if err := watch(&istionetworkingv1.WorkloadGroup{}, func(o any) []types.NamespacedName {
		if g, ok := o.(client.Object); ok {
			return c.rolloutsOf(ctx, g.GetNamespace(), g.GetName())
		}
		return nil
	}); err != nil {
		return err
	}
	if err := watch(&runtimev1alpha1.WorkloadAutoRegistration{}, func(o any) []types.NamespacedName {
		w, ok := o.(*runtimev1alpha1.WorkloadAutoRegistration)
		if !ok {
			return nil
		}
		return c.rolloutsOf(ctx, w.Namespace, w.Spec.WorkloadGroup.Name)
	}); err != nil {
		return err
	}
	if c.loop.WaitForSync(ctx) {
		c.log.Info("rolling out WorkloadGroups of WorkloadGroupRollouts")
	}
	c.loop.Run(ctx)
	return nil
}

// rolloutsOf returns the rollouts of group ns/name.
func (c *Controller) rolloutsOf(ctx context.Context, ns, name string) []types.NamespacedName {
	list := &runtimev1alpha1.WorkloadGroupRolloutList{}
	if err := c.opts.Cache.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []types.NamespacedName
	for i := range list.Items {
		if list.Items[i].Spec.WorkloadGroup == name {
			out = append(out, client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
	return out
}

// process reconciles one rollout and, while a batch is in progress, queues
// it again after RecheckInterval (its deadline).
func (c *Controller) process(ctx context.Context, key types.NamespacedName) error {
	again, err := c.reconcile(ctx, key)
	if err == nil && again {
		c.loop.AddAfter(key, c.opts.RecheckInterval)
	}
	return err
}

// workloadState is what the rollout needs to know of one registration.
type workloadState struct {
	war       *runtimev1alpha1.WorkloadAutoRegistration
	upToDate  bool
	connected bool
	ready     bool // connected, and Healthy where the group has a probe
}

func judge(war *runtimev1alpha1.WorkloadAutoRegistration, group *istionetworkingv1.WorkloadGroup) workloadState {
	st := workloadState{war: war}
	if snap, err := registry.GroupSpec(war.Spec.WorkloadGroup); err == nil {
		st.upToDate = len(lifecycle.SpecDiff(snap, &group.Spec)) == 0
	}
	st.connected = meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	st.ready = st.connected && (group.Spec.Probe == nil || meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionHealthy))
	return st
}

// MaxUnavailable resolves spec.maxUnavailable against total workloads: a
// number, or a percentage rounded down; at least 1.
func MaxUnavailable(v *intstr.IntOrString, total int) int {
	if v == nil {
		return DefaultMaxUnavailable
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, total, false)
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// reconcile moves one rollout on; again asks for a recheck after
// RecheckInterval (a batch is in progress).
func (c *Controller) reconcile(ctx context.Context, key types.NamespacedName) (again bool, err error) {
	ro := &runtimev1alpha1.WorkloadGroupRollout{}
	if err := c.opts.Cache.Get(ctx, key, ro); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if ro.DeletionTimestamp != nil {
		return false, nil
	}
	log := c.log.With("rollout", key.String())
	now := c.opts.Clock()
	status := ro.Status.DeepCopy()
	status.ObservedGeneration = ro.Generation

	group := &istionetworkingv1.WorkloadGroup{}
	if err := c.opts.Cache.Get(ctx, types.NamespacedName{Namespace: ro.Namespace, Name: ro.Spec.WorkloadGroup}, group); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		setCondition(status, ro, runtimev1alpha1.RolloutConditionProgressing, metav1.ConditionFalse, runtimev1alpha1.ReasonWorkloadGroupNotFound,
			fmt.Sprintf("WorkloadGroup %s/%s does not exist", ro.Namespace, ro.Spec.WorkloadGroup), now)
		return false, c.writeStatus(ctx, ro, status)
	}
	status.WorkloadGroupGeneration = group.Generation

	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := c.opts.Cache.List(ctx, list, client.InNamespace(ro.Namespace)); err != nil {
		return false, err
	}
	byName := map[string]workloadState{}
	for i := range list.Items {
		w := &list.Items[i]
		if w.DeletionTimestamp != nil || !ownedBy(w, group) {
			continue
		}
		byName[w.Name] = judge(w, group)
	}

	// The batch in progress: who is back, who is still to be asked (a
	// replica that took over after the batch was recorded but before its
	// registrations were deleted), and its deadline.
	deadline := time.Duration(DefaultProgressDeadlineSeconds) * time.Second
	if ro.Spec.ProgressDeadlineSeconds != nil {
		deadline = time.Duration(*ro.Spec.ProgressDeadlineSeconds) * time.Second
	}
	if b := status.Batch; b != nil {
		var pending []string
		for i := range b.Workloads {
			m := &b.Workloads[i]
			st, ok := byName[m.Name]
			if !m.Back && ok && st.war.UID != m.PreviousUID && st.upToDate && st.ready {
				m.Back = true
				log.Info("workload back", "registration", m.Name, "batch", b.Number)
			}
			if m.Back {
				continue
			}
			pending = append(pending, m.Name)
			if ok && st.war.UID == m.PreviousUID {
				if err := c.ask(ctx, ro, st.war, b.Number); err != nil {
					return false, err
				}
			}
		}
		switch {
		case len(pending) == 0:
			log.Info("batch done", "batch", b.Number)
			status.Batch = nil
		case b.DeadlineExceeded && !ro.Spec.Paused:
			log.Info("resumed: the batch gets a new deadline", "batch", b.Number, "pending", pending)
			b.DeadlineExceeded, b.StartedAt = false, metav1.NewTime(now)
		case !b.DeadlineExceeded && !now.Before(b.StartedAt.Add(deadline)):
			msg := fmt.Sprintf("%s not back (connected with the current WorkloadGroup spec%s) within %s of batch %d; rollout paused: resume with kubectl patch wgr %s -n %s --type merge -p '{\"spec\":{\"paused\":false}}'",
				strings.Join(pending, ", "), probeNote(group), deadline, b.Number, ro.Name, ro.Namespace)
			if err := c.pause(ctx, ro); err != nil {
				return false, err
			}
			b.DeadlineExceeded = true
			ro.Spec.Paused = true
			log.Warn("progress deadline exceeded; rollout paused", "batch", b.Number, "pending", pending)
			c.opts.Recorder.Event(ro, corev1.EventTypeWarning, runtimev1alpha1.ReasonProgressDeadlineExceeded, msg)
			setCondition(status, ro, runtimev1alpha1.RolloutConditionPaused, metav1.ConditionTrue, runtimev1alpha1.ReasonProgressDeadlineExceeded, msg, now)
		}
	}

	// Counts.
	pendingNames := map[string]bool{}
	if status.Batch != nil {
		for _, m := range status.Batch.Workloads {
			if !m.Back {
				pendingNames[m.Name] = true
			}
		}
	}
	var updated, skipped int32
	var candidates []*runtimev1alpha1.WorkloadAutoRegistration
	for name, st := range byName {
		switch {
		case st.upToDate:
			updated++
		case pendingNames[name]:
		case !st.connected:
			skipped++
		default:
			candidates = append(candidates, st.war)
		}
	}
	total := len(byName)
	for name := range pendingNames {
		if _, ok := byName[name]; !ok {
			total++ // asked, not registered again yet
		}
	}
	status.Total, status.Updated, status.Skipped = int32(total), updated, skipped

	// The next batch.
	if status.Batch == nil && !ro.Spec.Paused && len(candidates) > 0 {
		slices.SortFunc(candidates, func(a, b *runtimev1alpha1.WorkloadAutoRegistration) int { return strings.Compare(a.Name, b.Name) })
		n := min(MaxUnavailable(ro.Spec.MaxUnavailable, total), len(candidates))
		status.Batches++
		b := &runtimev1alpha1.RolloutBatch{Number: status.Batches, StartedAt: metav1.NewTime(now)}
		var names []string
		for _, w := range candidates[:n] {
			b.Workloads = append(b.Workloads, runtimev1alpha1.RolloutWorkload{Name: w.Name, PreviousUID: w.UID})
			names = append(names, w.Name)
		}
		status.Batch = b
		// Recorded first: a replica taking over finds the batch and asks
		// whoever was not asked yet.
		setProgress(status, ro, group, now)
		if err := c.writeStatus(ctx, ro, status); err != nil {
			return false, err
		}
		log.Info("batch started", "batch", b.Number, "workloads", names, "updated", updated, "total", total)
		for _, w := range candidates[:n] {
			if err := c.ask(ctx, ro, w, b.Number); err != nil {
				return false, err
			}
		}
		return true, nil
	}
	setProgress(status, ro, group, now)
	if err := c.writeStatus(ctx, ro, status); err != nil {
		return false, err
	}
	return status.Batch != nil, nil
}

func probeNote(group *istionetworkingv1.WorkloadGroup) string {
	if group.Spec.Probe != nil {
		return ", and Healthy"
	}
	return ""
}

// setProgress sets the Progressing and Paused conditions from the status.
func setProgress(status *runtimev1alpha1.WorkloadGroupRolloutStatus, ro *runtimev1alpha1.WorkloadGroupRollout, group *istionetworkingv1.WorkloadGroup, now time.Time) {
	switch {
	case status.Batch != nil:
		var pending []string
		for _, m := range status.Batch.Workloads {
			if !m.Back {
				pending = append(pending, m.Name)
			}
		}
		setCondition(status, ro, runtimev1alpha1.RolloutConditionProgressing, metav1.ConditionTrue, runtimev1alpha1.ReasonBatchInProgress,
			fmt.Sprintf("batch %d: %s onboarding again; %d of %d workloads have WorkloadGroup generation %d", status.Batch.Number, strings.Join(pending, ", "), status.Updated, status.Total, group.Generation), now)
	case status.Updated+status.Skipped == status.Total:
		msg := fmt.Sprintf("%d of %d workloads have WorkloadGroup generation %d", status.Updated, status.Total, group.Generation)
		if status.Skipped > 0 {
			msg += fmt.Sprintf("; %d disconnected ones are out of date and take part when they reconnect", status.Skipped)
		}
		setCondition(status, ro, runtimev1alpha1.RolloutConditionProgressing, metav1.ConditionFalse, runtimev1alpha1.ReasonRolloutComplete, msg, now)
	case ro.Spec.Paused:
		setCondition(status, ro, runtimev1alpha1.RolloutConditionProgressing, metav1.ConditionTrue, runtimev1alpha1.ReasonRolloutPaused,
			fmt.Sprintf("paused with %d of %d workloads at WorkloadGroup generation %d: no new batch starts", status.Updated, status.Total, group.Generation), now)
	}
	if !ro.Spec.Paused {
		setCondition(status, ro, runtimev1alpha1.RolloutConditionPaused, metav1.ConditionFalse, runtimev1alpha1.ReasonNotPaused, "new batches start when the previous one is back", now)
	} else if status.Batch == nil || !status.Batch.DeadlineExceeded {
		setCondition(status, ro, runtimev1alpha1.RolloutConditionPaused, metav1.ConditionTrue, runtimev1alpha1.ReasonPausedByUser, "spec.paused is true: no new batch starts", now)
	}
}

func setCondition(status *runtimev1alpha1.WorkloadGroupRolloutStatus, ro *runtimev1alpha1.WorkloadGroupRollout, typ string, s metav1.ConditionStatus, reason, msg string, now time.Time) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: ro.Generation, LastTransitionTime: metav1.NewTime(now)})
}

// writeStatus writes status when it differs from the stored one, with the
// cached resourceVersion as precondition (a conflict is retried from the
// queue with a fresh cache read).
func (c *Controller) writeStatus(ctx context.Context, ro *runtimev1alpha1.WorkloadGroupRollout, status *runtimev1alpha1.WorkloadGroupRolloutStatus) error {
	if equality.Semantic.DeepEqual(&ro.Status, status) {
		return nil
	}
	cur := ro.DeepCopy()
	cur.Status = *status
	if err := c.opts.Client.Status().Update(ctx, cur); err != nil {
		return fmt.Errorf("write status of rollout %s/%s: %w", ro.Namespace, ro.Name, err)
	}
	ro.ResourceVersion = cur.ResourceVersion
	ro.Status = cur.Status
	return nil
}

// pause sets spec.paused.
func (c *Controller) pause(ctx context.Context, ro *runtimev1alpha1.WorkloadGroupRollout) error {
	cur := ro.DeepCopy()
	cur.Spec.Paused = true
	if err := c.opts.Client.Update(ctx, cur); err != nil {
		return fmt.Errorf("pause rollout %s/%s: %w", ro.Namespace, ro.Name, err)
	}
	ro.ResourceVersion, ro.Generation = cur.ResourceVersion, cur.Generation
	return nil
}

// ask asks a workload to onboard again: its registration is deleted (with
// its UID as precondition); its agent's registration watch sees it and
// onboards again with the group's current spec.
func (c *Controller) ask(ctx context.Context, ro *runtimev1alpha1.WorkloadGroupRollout, war *runtimev1alpha1.WorkloadAutoRegistration, batch int32) error {
	if err := c.asks.Wait(ctx); err != nil {
		return err
	}
	uid := war.UID
	err := c.opts.Client.Delete(ctx, war, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced already
	}
	if err != nil {
		return fmt.Errorf("ask %s/%s to onboard again: %w", war.Namespace, war.Name, err)
	}
	msg := fmt.Sprintf("Asked to onboard again by WorkloadGroupRollout %s (batch %d): WorkloadGroup %s changed", ro.Name, batch, ro.Spec.WorkloadGroup)
	c.opts.Recorder.Event(war, corev1.EventTypeNormal, runtimev1alpha1.ReasonRolloutReonboard, msg)
	c.opts.Recorder.Eventf(ro, corev1.EventTypeNormal, runtimev1alpha1.ReasonRolloutReonboard, "Batch %d: asked %s to onboard again", batch, war.Name)
	return nil
}

func ownedBy(war *runtimev1alpha1.WorkloadAutoRegistration, group *istionetworkingv1.WorkloadGroup) bool {
	for _, ref := range war.OwnerReferences {
		if ref.Kind == "WorkloadGroup" && ref.Name == group.Name && ref.UID == group.UID {
			return true
		}
	}
	return false
}
