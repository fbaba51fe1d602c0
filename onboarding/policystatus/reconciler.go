package policystatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/internal/loop"
	"github.com/embark-mesh/embark/onboarding/policy"
)

// Options configure a Reconciler. Zero fields take their defaults.
type Options struct {
	// Client writes the status subresource. Required.
	Client client.Client
	// Cache reads OnboardingPolicies and WorkloadGroups (the informer
	// cache). Required.
	Cache client.Reader
	// Decisions are this replica's decisions (the Authorizer's
	// DecisionRecorder). Default: none, only the selection is written.
	Decisions *Decisions
	// Logger. Default: discard.
	Logger *slog.Logger
	// QPS and Burst bound status writes of this replica. Default 5 and 10.
	QPS   float64
	Burst int
	// DecisionInterval: a decision time is written only when it is this
	// much later than the stored one, so a workload retrying every second
	// costs one write per interval. Default 30s.
	DecisionInterval time.Duration
	// Resync: every policy is reconciled at least this often (informer
	// events and decisions trigger it sooner). Default 1m.
	Resync time.Duration
}

// Reconciler writes OnboardingPolicy status. It runs on the shared loop
// (internal/loop) with one key, every policy: a trigger queues it, and
// while it is queued or being reconciled further triggers fold into one
// more reconcile.
type Reconciler struct {
	o       Options
	limiter *rate.Limiter
	loop    *loop.Loop
}

// everyPolicy is the loop's one key: ReconcileAll.
var everyPolicy = types.NamespacedName{Name: "*"}

// New returns a Reconciler.
func New(o Options) (*Reconciler, error) {
	if o.Client == nil || o.Cache == nil {
		return nil, errors.New("policystatus: Client and Cache are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.QPS <= 0 {
		o.QPS = 5
	}
	if o.Burst <= 0 {
		o.Burst = 10
	}
	if o.DecisionInterval <= 0 {
		o.DecisionInterval = 30 * time.Second
	}
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
	r := &Reconciler{o: o, limiter: rate.NewLimiter(rate.Limit(o.QPS), o.Burst)}
	r.loop = loop.New(func(ctx context.Context, _ types.NamespacedName) error { return r.ReconcileAll(ctx) }, loop.Options{
		Name:   "write OnboardingPolicy status",
		Resync: o.Resync,
		Keys:   func(context.Context) ([]types.NamespacedName, error) { return []types.NamespacedName{everyPolicy}, nil },
		Logger: o.Logger,
	})
	return r, nil
}

// Trigger asks for a reconcile of every policy soon (informer event
// handlers call it). It never blocks.
func (r *Reconciler) Trigger() { r.loop.Add(everyPolicy) }

// Run reconciles now, on triggers, new decisions and every Resync until ctx
// ends; a failed reconcile is retried with the loop's back-off.
func (r *Reconciler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if r.o.Decisions != nil {
		wg.Go(func() { r.triggerOn(ctx, r.o.Decisions.Changed()) })
	}
	r.loop.Run(ctx)
	wg.Wait()
	return nil
}

// triggerOn triggers a reconcile whenever changed receives, until ctx ends.
func (r *Reconciler) triggerOn(ctx context.Context, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			r.Trigger()
		}
	}
}

// ReconcileAll writes the status of every OnboardingPolicy whose status
// differs from what it should be.
func (r *Reconciler) ReconcileAll(ctx context.Context) error {
	var policies authorizationv1alpha1.OnboardingPolicyList
	if err := r.o.Cache.List(ctx, &policies); err != nil {
		return fmt.Errorf("list OnboardingPolicies: %w", err)
	}
	groupsByNS := map[string][]*networkingv1.WorkloadGroup{}
	var errs []error
	for i := range policies.Items {
		p := &policies.Items[i]
		groups, ok := groupsByNS[p.Namespace]
		if !ok {
			var list networkingv1.WorkloadGroupList
			if err := r.o.Cache.List(ctx, &list, client.InNamespace(p.Namespace)); err != nil {
				return fmt.Errorf("list WorkloadGroups in %s: %w", p.Namespace, err)
			}
			groups = list.Items
			groupsByNS[p.Namespace] = groups
		}
		want := r.desired(p, groups)
		if equality.Semantic.DeepEqual(p.Status, want) {
			continue
		}
		if err := r.write(ctx, p, want); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// desired is p's status from the groups of its namespace and the decisions.
func (r *Reconciler) desired(p *authorizationv1alpha1.OnboardingPolicy, groups []*networkingv1.WorkloadGroup) authorizationv1alpha1.OnboardingPolicyStatus {
	var selected []string
	for _, wg := range groups {
		if policy.Selects(p, policy.GroupRefOf(wg)) {
			selected = append(selected, wg.Name)
		}
	}
	slices.Sort(selected)
	s := authorizationv1alpha1.OnboardingPolicyStatus{
		ObservedGeneration:         p.Generation,
		SelectedWorkloadGroupCount: int32(len(selected)),
		SelectedWorkloadGroups:     selected[:min(len(selected), authorizationv1alpha1.MaxListedWorkloadGroups)],
		LastAllowedTime:            p.Status.LastAllowedTime,
		LastDeniedTime:             p.Status.LastDeniedTime,
	}
	if len(s.SelectedWorkloadGroups) == 0 {
		s.SelectedWorkloadGroups = nil
	}
	if d := r.o.Decisions; d != nil {
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		s.LastAllowedTime = r.later(s.LastAllowedTime, d.lastAllowed(key))
		s.LastDeniedTime = r.later(s.LastDeniedTime, d.lastDenied(p.Namespace, selected))
	}
	return s
}

// later returns seen (to the second) when it is DecisionInterval or more
// after stored, else stored.
func (r *Reconciler) later(stored *metav1.Time, seen time.Time) *metav1.Time {
	if seen.IsZero() {
		return stored
	}
	seen = seen.Truncate(time.Second)
	if stored != nil && seen.Sub(stored.Time) < r.o.DecisionInterval {
		return stored
	}
	return &metav1.Time{Time: seen}
}

// write stores want as p's status, with p's resourceVersion (a conflict
// means another replica wrote first: the next reconcile starts from its
// status).
func (r *Reconciler) write(ctx context.Context, p *authorizationv1alpha1.OnboardingPolicy, want authorizationv1alpha1.OnboardingPolicyStatus) error {
	if err := r.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the status write rate limit: %w", err)
	}
	cur := p.DeepCopy() // never mutate the cache's object
	cur.Status = want
	if err := r.o.Client.Status().Update(ctx, cur); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			r.Trigger()
			return nil
		}
		return fmt.Errorf("update OnboardingPolicy %s/%s status: %w", p.Namespace, p.Name, err)
	}
	r.o.Logger.Debug("OnboardingPolicy status written", "namespace", p.Namespace, "policy", p.Name,
		"selectedWorkloadGroups", want.SelectedWorkloadGroupCount)
	return nil
}
