package lifecycle

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/test/fixtures"
)

// ownerReferenceOf is the owner reference Embark puts on what a
// registration owns (registry.BuildWorkloadEntry, the credential Secret).
func ownerReferenceOf(war *runtimev1alpha1.WorkloadAutoRegistration) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: runtimev1alpha1.SchemeGroupVersion.String(), Kind: "WorkloadAutoRegistration",
		Name: war.Name, UID: war.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}
}

func TestJudgeOrphan(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	live := &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", UID: "uid-live"}}
	newer := &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", UID: "uid-newer"}}
	old := now.Add(-time.Minute)
	secret := func(created time.Time, refs ...metav1.OwnerReference) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm-sidecar", CreationTimestamp: metav1.NewTime(created), OwnerReferences: refs}}
	}
	otherOwner := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "ratings-vm", UID: "uid-live", Controller: ptr.To(true)}
	notController := ownerReferenceOf(live)
	notController.Controller = nil
	deleting := secret(old)
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(now))
	tests := []struct {
		name        string
		obj         client.Object
		registered  *runtimev1alpha1.WorkloadAutoRegistration // what the lookup finds
		lookupErr   error
		wantVerdict orphanVerdict
		wantAt      time.Time
		wantWhy     string
		wantErr     bool
	}{
		{name: "owned by the live registration", obj: secret(old, ownerReferenceOf(live)), registered: live, wantVerdict: orphanKeep},
		{name: "registration gone", obj: secret(old, ownerReferenceOf(live)), wantVerdict: orphanRemove, wantWhy: "no longer exists"},
		{name: "registration of the same name is another one", obj: secret(old, ownerReferenceOf(live)), registered: newer, wantVerdict: orphanRemove, wantWhy: "now is uid uid-newer"},
		{name: "owner reference stripped by orphan propagation", obj: secret(old), registered: live, wantVerdict: orphanRemove, wantWhy: "names no registration"},
		{name: "owned by something else only", obj: secret(old, otherOwner), registered: live, wantVerdict: orphanRemove, wantWhy: "names no registration"},
		{name: "registration reference that is not the controller", obj: secret(old, notController), registered: live, wantVerdict: orphanRemove, wantWhy: "names no registration"},
		{name: "too young, even without an owner", obj: secret(now.Add(-time.Second)), wantVerdict: orphanWait, wantAt: now.Add(9 * time.Second)},
		{name: "too young, registration gone", obj: secret(now, ownerReferenceOf(live)), wantVerdict: orphanWait, wantAt: now.Add(10 * time.Second)},
		{name: "being deleted", obj: deleting, wantVerdict: orphanKeep},
		{name: "lookup fails", obj: secret(old, ownerReferenceOf(live)), lookupErr: errors.New("API server unavailable"), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(_ context.Context, name string) (*runtimev1alpha1.WorkloadAutoRegistration, error) {
				if tc.lookupErr != nil {
					return nil, tc.lookupErr
				}
				if tc.registered != nil && tc.registered.Name == name {
					return tc.registered, nil
				}
				return nil, nil
			}
			d, err := judgeOrphan(t.Context(), tc.obj, now, 10*time.Second, lookup)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if d.verdict != tc.wantVerdict || !d.at.Equal(tc.wantAt) || !strings.Contains(d.why, tc.wantWhy) {
				t.Errorf("judgeOrphan = %+v, want verdict %v at %s why containing %q", d, tc.wantVerdict, tc.wantAt, tc.wantWhy)
			}
		})
	}
}

// createCredential creates war's sidecar credential Secret as Register does.
func createCredential(t *testing.T, war *runtimev1alpha1.WorkloadAutoRegistration) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: registry.SidecarSecretName(war.Name), Namespace: war.Namespace,
			Labels:          map[string]string{registry.LabelSidecarCredential: "true"},
			OwnerReferences: []metav1.OwnerReference{ownerReferenceOf(war)},
		},
		Type: registry.SecretTypeSidecarCredential,
	}
	if err := env.Client.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitGoneLive waits until the API server no longer has obj.
func waitGoneLive(t *testing.T, obj client.Object, what string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("%s %s still exists: %v", what, obj.GetName(), err)
	}
}

// orphanDelete deletes war as `kubectl delete --cascade=orphan` does and
// waits until war is gone and the garbage collector has stripped the owner
// references of the objects it owned (as the API server and c show them),
// or they are removed already.
func orphanDelete(t *testing.T, c client.Reader, war *runtimev1alpha1.WorkloadAutoRegistration, owned ...client.Object) {
	t.Helper()
	if err := env.Client.Delete(t.Context(), war, client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
		t.Fatal(err)
	}
	waitGoneLive(t, war, "registration deleted with orphan propagation")
	for _, o := range owned {
		for _, r := range []client.Reader{env.Client, c} {
			err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				cur := o.DeepCopyObject().(client.Object)
				if err := r.Get(ctx, client.ObjectKeyFromObject(o), cur); err != nil {
					return apierrors.IsNotFound(err), client.IgnoreNotFound(err) // removed already
				}
				return len(cur.GetOwnerReferences()) == 0, nil
			})
			if err != nil {
				t.Fatalf("%T %s kept its owner reference: %v", o, o.GetName(), err)
			}
		}
	}
}

// The orphan rule against the real API server and garbage collector: a
// registration deleted with orphan propagation leaves its credential Secret
// and WorkloadEntry without an owner, and the collector removes them; it
// keeps a live registration's, and Secrets and WorkloadEntries that are not
// Embark's.
func TestOrphanCollectorRemovesOnlyOrphans(t *testing.T) {
	ns := env.Namespace(t)
	ctx := t.Context()
	wg := lifecycleGroup(t, ns)
	orphaned, orphanedEntry := createRegistration(t, wg, 1)
	orphanedSecret := createCredential(t, orphaned)
	live, liveEntry := createRegistration(t, wg, 2)
	liveSecret := createCredential(t, live)
	// Not Embark's: a Secret of the application, one with the label but not
	// the credential type, a WorkloadEntry without Embark's annotation.
	foreignSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-credentials", Namespace: ns}, StringData: map[string]string{"k": "v"}}
	labelOnly := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "looks-like-a-credential", Namespace: ns, Labels: map[string]string{registry.LabelSidecarCredential: "true"}}}
	foreignEntry := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "legacy-vm", Namespace: ns}}
	foreignEntry.Spec.Address = "10.9.9.9"
	for _, o := range []client.Object{foreignSecret, labelOnly, foreignEntry} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	c, err := env.StartCacheIn(ctx, []string{ns}, nil, &corev1.SecretList{}, &istionetworkingv1.WorkloadEntryList{}, &runtimev1alpha1.WorkloadAutoRegistrationList{})
	if err != nil {
		t.Fatal(err)
	}
	orphanDelete(t, c, orphaned, orphanedSecret, orphanedEntry)

	for _, kind := range []dependentKind{sidecarCredentials, workloadEntries} {
		col := &orphanCollector{
			kind: kind, client: env.Client, reader: env.Client, cache: c, writer: write.New(write.Options{}),
			removals: rate.NewLimiter(rate.Inf, 1), log: fixtures.Logger(t), now: time.Now, minAge: 0,
			queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]()),
		}
		t.Cleanup(col.queue.ShutDown)
		keys, err := col.keys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := col.reconcile(ctx, k); err != nil {
				t.Errorf("reconcile %s %s: %v", kind.name, k, err)
			}
		}
		for _, o := range []client.Object{foreignSecret, labelOnly, foreignEntry} {
			if err := col.reconcile(ctx, client.ObjectKeyFromObject(o)); err != nil {
				t.Errorf("reconcile %s: %v", o.GetName(), err)
			}
		}
	}
	for _, o := range []client.Object{orphanedSecret, orphanedEntry} {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object)); !apierrors.IsNotFound(err) {
			t.Errorf("orphaned %T %s: %v, want it removed", o, o.GetName(), err)
		}
	}
	for _, o := range []client.Object{liveSecret, liveEntry, foreignSecret, labelOnly, foreignEntry} {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object)); err != nil {
			t.Errorf("%T %s: %v, want it kept", o, o.GetName(), err)
		}
	}
}

// An object younger than orphanMinAge is left to the Register call that is
// writing it, and judged again once it is old enough.
func TestOrphanCollectorWaitsForYoungObjects(t *testing.T) {
	ns := env.Namespace(t)
	ctx := t.Context()
	wg := lifecycleGroup(t, ns)
	war, _ := createRegistration(t, wg, 1)
	secret := createCredential(t, war)
	c, err := env.StartCacheIn(ctx, []string{ns}, nil, &corev1.SecretList{}, &runtimev1alpha1.WorkloadAutoRegistrationList{})
	if err != nil {
		t.Fatal(err)
	}
	orphanDelete(t, c, war, secret)
	created := secret.CreationTimestamp.Time
	now := created.Add(time.Second)
	col := &orphanCollector{
		kind: sidecarCredentials, client: env.Client, reader: env.Client, cache: c, writer: write.New(write.Options{}),
		removals: rate.NewLimiter(rate.Inf, 1), log: fixtures.Logger(t), now: func() time.Time { return now }, minAge: time.Hour,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]()),
	}
	t.Cleanup(col.queue.ShutDown)
	if err := col.reconcile(ctx, client.ObjectKeyFromObject(secret)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{}); err != nil {
		t.Fatalf("a Secret younger than the minimum age: %v, want it kept", err)
	}
	if n := col.queue.Len(); n != 0 {
		t.Errorf("queued at once: %d, want it queued for later", n)
	}
	now = created.Add(time.Hour)
	if err := col.reconcile(ctx, client.ObjectKeyFromObject(secret)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Secret once old enough: %v, want it removed", err)
	}
}

// The elected sweeper runs the collector: what a registration deleted with
// orphan propagation leaves behind is removed, counted by kind.
func TestSweeperLeaderRemovesOrphans(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	war, entry := createRegistration(t, wg, 1)
	secret := createCredential(t, war)
	h := startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = time.Hour })
	orphanDelete(t, h.cache, war, secret, entry)
	waitGoneLive(t, secret, "orphaned credential Secret")
	waitGoneLive(t, entry, "orphaned WorkloadEntry")
	if got := metricValue(t, h.reg, "embark_registry_orphans_removed_total", orphanSecret); got != 1 {
		t.Errorf("orphaned Secrets removed = %v, want 1", got)
	}
	if got := metricValue(t, h.reg, "embark_registry_orphans_removed_total", orphanWorkloadEntry); got != 1 {
		t.Errorf("orphaned WorkloadEntries removed = %v, want 1", got)
	}
}
