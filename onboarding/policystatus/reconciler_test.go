package policystatus

import (
	"context"
	"os"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env    *testenv.Env
	cached cache.Cache
)

func TestMain(m *testing.M) {
	os.Exit(testenv.CheckLeaks(testenv.Run(m, testenv.Options{}, &env, func(ctx context.Context) error {
		var err error
		cached, err = env.StartCache(ctx, nil, &authorizationv1alpha1.OnboardingPolicyList{}, &networkingv1.WorkloadGroupList{})
		return err
	})))
}

func createGroup(t *testing.T, ns, name string, lbls map[string]string) *networkingv1.WorkloadGroup {
	t.Helper()
	wg := &networkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls}}
	wg.Spec.Template = &istioapi.WorkloadEntry{ServiceAccount: name}
	if err := env.Client.Create(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
	return wg
}

// countingClient counts status writes that the API server accepted: an
// update refused as a conflict (the reconciler's cache a step behind its
// own last write, as under load) writes nothing.
type countingClient struct {
	client.Client
	writes *int
}

func (c countingClient) Status() client.SubResourceWriter {
	return countingWriter{c.Client.Status(), c.writes}
}

type countingWriter struct {
	client.SubResourceWriter
	writes *int
}

func (w countingWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	err := w.SubResourceWriter.Update(ctx, obj, opts...)
	if err == nil {
		*w.writes++
	}
	return err
}

// The status names the WorkloadGroups the policy selects (following label
// changes), carries this replica's decisions no more often than
// DecisionInterval, and is written only when it changes.
func TestStatusFollowsSelectionAndDecisions(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	createGroup(t, ns, "ratings", map[string]string{"app": "ratings"})
	reviews := createGroup(t, ns, "reviews", map[string]string{"app": "reviews"})
	p := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "ratings-vms", Namespace: ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{JWT: &authorizationv1alpha1.JWTMatcher{Issuer: "https://issuer.example.corp"}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "backend"}}}},
		}}},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	writes := 0
	d := NewDecisions()
	r, err := New(Options{Client: countingClient{env.Client, &writes}, Cache: cached, Decisions: d})
	if err != nil {
		t.Fatal(err)
	}
	status := func() authorizationv1alpha1.OnboardingPolicyStatus {
		t.Helper()
		var got authorizationv1alpha1.OnboardingPolicy
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatal(err)
		}
		return got.Status
	}
	// reconcileUntil reconciles (as the informer events would trigger)
	// until the stored status satisfies ok.
	reconcileUntil := func(what string, ok func(authorizationv1alpha1.OnboardingPolicyStatus) bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			if err := r.ReconcileAll(ctx); err != nil {
				return false, err
			}
			return ok(status()), nil
		}); err != nil {
			t.Fatalf("%s: %v; status %+v", what, err, status())
		}
	}
	reconcileUntil("nothing selected yet: the status says so", func(s authorizationv1alpha1.OnboardingPolicyStatus) bool {
		return s.ObservedGeneration == p.Generation && s.SelectedWorkloadGroupCount == 0 && s.SelectedWorkloadGroups == nil
	})

	// Labelling both groups tier=backend selects them.
	for _, name := range []string{"ratings", "reviews"} {
		var wg networkingv1.WorkloadGroup
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &wg); err != nil {
			t.Fatal(err)
		}
		wg.Labels["tier"] = "backend"
		if err := env.Client.Update(ctx, &wg); err != nil {
			t.Fatal(err)
		}
	}
	reconcileUntil("both groups selected", func(s authorizationv1alpha1.OnboardingPolicyStatus) bool {
		return s.SelectedWorkloadGroupCount == 2 && join(s.SelectedWorkloadGroups) == "ratings,reviews"
	})

	// Nothing changed: no write.
	before := writes
	for range 3 {
		if err := r.ReconcileAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if writes != before {
		t.Errorf("%d status writes without a change", writes-before)
	}

	// Decisions: an allow by this policy and a denial for a selected group.
	t0 := time.Now().Truncate(time.Second)
	d.Allowed(ns, p.Name, t0.Add(300*time.Millisecond))
	d.Denied(ns, "reviews", t0)
	d.Denied("other-namespace", "reviews", t0.Add(time.Hour)) // not this policy's
	reconcileUntil("decision times", func(s authorizationv1alpha1.OnboardingPolicyStatus) bool {
		return s.LastAllowedTime != nil && s.LastAllowedTime.Time.Equal(t0) && s.LastDeniedTime != nil && s.LastDeniedTime.Time.Equal(t0)
	})
	// A decision within DecisionInterval is not written; a later one is.
	before = writes
	d.Allowed(ns, p.Name, t0.Add(10*time.Second))
	if err := r.ReconcileAll(ctx); err != nil {
		t.Fatal(err)
	}
	if writes != before || !status().LastAllowedTime.Time.Equal(t0) {
		t.Errorf("an allow 10s after the stored one was written (%d writes): %v", writes-before, status().LastAllowedTime)
	}
	d.Allowed(ns, p.Name, t0.Add(31*time.Second))
	reconcileUntil("an allow 31s later", func(s authorizationv1alpha1.OnboardingPolicyStatus) bool {
		return s.LastAllowedTime.Time.Equal(t0.Add(31 * time.Second))
	})

	// A deleted group leaves the selection.
	if err := env.Client.Delete(ctx, reviews); err != nil {
		t.Fatal(err)
	}
	reconcileUntil("reviews deleted", func(s authorizationv1alpha1.OnboardingPolicyStatus) bool {
		return s.SelectedWorkloadGroupCount == 1 && join(s.SelectedWorkloadGroups) == "ratings"
	})
}

// Run reconciles on its own when a decision is recorded.
func TestRunWritesOnDecision(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	ns := env.Namespace(t)
	p := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "any", Namespace: ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{JWT: &authorizationv1alpha1.JWTMatcher{Issuer: "https://issuer.example.corp"}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		}}},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	d := NewDecisions()
	r, err := New(Options{Client: env.Client, Cache: cached, Decisions: d, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	at := time.Now().Truncate(time.Second)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		d.Allowed(ns, "any", at) // again, in case the cache had not seen the policy yet
		var got authorizationv1alpha1.OnboardingPolicy
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			return false, err
		}
		return got.Status.LastAllowedTime != nil && got.Status.LastAllowedTime.Time.Equal(at), nil
	}); err != nil {
		t.Fatalf("Run did not write the decision: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func join(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}
