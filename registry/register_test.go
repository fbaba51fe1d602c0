package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env      *testenv.Env
	cached   cache.Cache
	recorder record.EventRecorder
)

// TestMain fails the package when a goroutine (a connection writer, a
// sweeper worker) outlives the tests.
func TestMain(m *testing.M) {
	os.Exit(testenv.CheckLeaks(testenv.Run(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		cached, err = env.StartCache(ctx, func(c cache.Cache) error { return SetupIndexes(ctx, c) },
			&istionetworkingv1.WorkloadEntryList{}) // the informer the registrar reads
		if err != nil {
			return err
		}
		recorder, err = env.EventRecorder(ctx, "embark-registry-test")
		return err
	})))
}

func newRegistrar(t *testing.T, c client.Client) *Registrar {
	t.Helper()
	if c == nil {
		c = env.Client
	}
	r, err := NewRegistrar(Options{Client: c, Cache: cached, Recorder: recorder, Logger: fixtures.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// createGroup creates the example ratings WorkloadGroup in ns, its template
// serving port http 8080, and the service account it names.
func createGroup(t *testing.T, ns string) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	wg := fixtures.SeedGroup(ns)
	wg.Spec.Template.Ports = map[string]uint32{"http": 8080}
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	return wg
}

const seedName = "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0"

func TestRegisterCreatesRegistrationAndWorkloadEntry(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	reg := fixtures.Registration("172.31.5.254")
	reg.Workload.Labels = map[string]string{"version": "v5"}
	res, err := newRegistrar(t, nil).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity(fixtures.InstanceID), Registration: reg})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || res.Registration.Name != seedName {
		t.Fatalf("created=%v name=%q, want the documented name", res.Created, res.Registration.Name)
	}

	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: seedName}, war); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(war); ref == nil || ref.Kind != "WorkloadGroup" || ref.UID != wg.UID {
		t.Errorf("registration owner = %+v, want the WorkloadGroup", ref)
	}
	snap, err := GroupSpec(war.Spec.WorkloadGroup)
	if err != nil {
		t.Fatal(err)
	}
	if war.Spec.WorkloadGroup.UID != wg.UID || snap.GetTemplate().GetServiceAccount() != "ratings-vm" || snap.GetTemplate().GetNetwork() != "virtual-machines" {
		t.Errorf("snapshot = %+v / %v", war.Spec.WorkloadGroup, snap)
	}

	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: seedName}, we); err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{"app": "ratings", "class": "vm", "version": "v5", LabelNetwork: "virtual-machines",
		LabelHostname: "ip-172-31-5-254", LabelCanonicalName: "ratings", LabelCanonicalRevision: "v5"}
	if fmt.Sprint(we.Labels) != fmt.Sprint(wantLabels) || fmt.Sprint(we.Spec.Labels) != fmt.Sprint(wantLabels) {
		t.Errorf("labels = %v / spec %v, want %v", we.Labels, we.Spec.Labels, wantLabels)
	}
	if we.Spec.Address != "172.31.5.254" || we.Spec.Network != "virtual-machines" || we.Spec.Locality != "us-east-2/us-east-2b" ||
		we.Spec.ServiceAccount != "ratings-vm" || we.Spec.Ports["http"] != 8080 {
		t.Errorf("WorkloadEntry spec = %v", &we.Spec)
	}
	if we.Annotations[AnnotationWorkloadGroup] != "ratings" {
		t.Errorf("annotations = %v", we.Annotations)
	}
	if ref := metav1.GetControllerOf(we); ref == nil || ref.Kind != "WorkloadAutoRegistration" || ref.UID != war.UID || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("WorkloadEntry owner = %+v", ref)
	}
	fixtures.WaitEvent(t, env.Client, ns, seedName, ReasonRegistered, "172.31.5.254")

	// Deleting the registration removes its WorkloadEntry (owner reference).
	if err := env.Client.Delete(ctx, war); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitGone(t, env.Client, we)
}

func TestRegisterAgainReusesTheRegistration(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	r := newRegistrar(t, nil)
	req := Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")}
	first, err := r.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}

	// The same registration again writes nothing.
	again, err := r.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.Created || again.Registration.UID != first.Registration.UID ||
		again.Registration.ResourceVersion != first.Registration.ResourceVersion ||
		again.WorkloadEntry.ResourceVersion != first.WorkloadEntry.ResourceVersion {
		t.Errorf("re-register rewrote: registration rv %s -> %s, entry rv %s -> %s",
			first.Registration.ResourceVersion, again.Registration.ResourceVersion,
			first.WorkloadEntry.ResourceVersion, again.WorkloadEntry.ResourceVersion)
	}

	// The group changes, the workload comes back with a new address: the
	// address is updated, the snapshot is kept.
	wg.Spec.Template.ServiceAccount = "ratings-v2"
	if err := env.Client.Update(ctx, wg); err != nil {
		t.Fatal(err)
	}
	req.Group = wg
	req.Registration = fixtures.Registration("172.31.9.9")
	moved, err := r.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Created || moved.Registration.UID != first.Registration.UID {
		t.Error("a second registration was created")
	}
	if moved.WorkloadEntry.Spec.Address != "172.31.9.9" || moved.Registration.Spec.Registration.Host.Addresses[0].IP != "172.31.9.9" {
		t.Errorf("address not updated: %s", moved.WorkloadEntry.Spec.Address)
	}
	if moved.WorkloadEntry.Spec.ServiceAccount != "ratings-vm" || moved.Registration.Spec.WorkloadGroup.Generation != first.Registration.Spec.WorkloadGroup.Generation {
		t.Errorf("snapshot replaced on re-register: service account %q", moved.WorkloadEntry.Spec.ServiceAccount)
	}
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
		t.Errorf("registrations in namespace: %d (%v), want 1", len(list.Items), err)
	}
}

func TestConcurrentRegistersOfOneWorkloadMakeOneRegistration(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	// Two replicas race to register the same workload.
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := newRegistrar(t, nil).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration(fmt.Sprintf("172.31.5.%d", 10+i%2))})
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
		t.Fatalf("registrations: %d (%v), want 1", len(list.Items), err)
	}
	entries := &istionetworkingv1.WorkloadEntryList{}
	if err := env.Client.List(ctx, entries, client.InNamespace(ns)); err != nil || len(entries.Items) != 1 {
		t.Fatalf("entries: %d (%v), want 1", len(entries.Items), err)
	}
	if got, want := entries.Items[0].Spec.Address, list.Items[0].Spec.Registration.Host.Addresses[0].IP; got != want {
		t.Errorf("entry address %s != registration address %s", got, want)
	}
}

func TestIPReuseFencesTheOlderRegistration(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	r := newRegistrar(t, nil)
	old, err := r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000a"), Registration: fixtures.Registration("10.0.0.5")})
	if err != nil {
		t.Fatal(err)
	}
	fixtures.WaitCached(t, cached, old.WorkloadEntry)

	// A new instance got the same private IP while the old registration is
	// still within its grace period.
	fresh, err := r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000b"), Registration: fixtures.Registration("10.0.0.5"), AddressProven: true})
	if err != nil {
		t.Fatal(err)
	}
	fixtures.WaitGone(t, env.Client, old.WorkloadEntry)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(fresh.WorkloadEntry), &istionetworkingv1.WorkloadEntry{}); err != nil {
		t.Errorf("new WorkloadEntry: %v", err)
	}
	fenced := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(old.Registration), fenced); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(fenced.Status.Conditions, runtimev1alpha1.ConditionFenced)
	if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "10.0.0.5") || !strings.Contains(cond.Message, fresh.Registration.Name) {
		t.Errorf("Fenced condition = %+v", cond)
	}
	fixtures.WaitEvent(t, env.Client, ns, old.Registration.Name, ReasonFenced, fresh.Registration.Name)

	entries := &istionetworkingv1.WorkloadEntryList{}
	if err := env.Client.List(ctx, entries, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(entries.Items) != 1 {
		t.Errorf("%d WorkloadEntries hold 10.0.0.5, want 1", len(entries.Items))
	}

	// The fenced workload comes back with a new address: it gets an entry
	// again and the condition clears.
	fixtures.WaitCached(t, cached, fresh.WorkloadEntry)
	back, err := r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000a"), Registration: fixtures.Registration("10.0.0.6")})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(back.Registration), fenced); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(fenced.Status.Conditions, runtimev1alpha1.ConditionFenced); cond == nil || cond.Status != metav1.ConditionFalse {
		t.Errorf("Fenced condition after re-register = %+v", cond)
	}
}

func TestAddressHeldByAnUnmanagedWorkloadEntryIsRefused(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	manual := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "hand-made", Namespace: ns}}
	manual.Spec.Address = "10.0.0.7"
	manual.Spec.Network = "virtual-machines"
	if err := env.Client.Create(ctx, manual); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitCached(t, cached, manual)
	_, err := newRegistrar(t, nil).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000c"), Registration: fixtures.Registration("10.0.0.7")})
	if !errors.Is(err, ErrAddressConflict) || !strings.Contains(err.Error(), "hand-made") {
		t.Fatalf("err = %v, want ErrAddressConflict naming the entry", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(manual), &istionetworkingv1.WorkloadEntry{}); err != nil {
		t.Errorf("the unmanaged entry was touched: %v", err)
	}
	assertNoRegistrations(t, ns)
}

// injectedFailure fails the writes that fail says fail.
func injectedFailure(fail func(obj client.Object, subResource string) bool) client.WithWatch {
	forbidden := func(obj client.Object) error {
		return apierrors.NewForbidden(istionetworkingv1.Resource("workloadentries"), obj.GetName(), errors.New("injected failure"))
	}
	return interceptor.NewClient(env.Client, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if fail(obj, "") {
				return forbidden(obj)
			}
			return c.Create(ctx, obj, opts...)
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, subResource string, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
			if fail(obj, subResource) {
				return forbidden(obj)
			}
			return c.SubResource(subResource).Create(ctx, obj, sub, opts...)
		},
	})
}

// A Register whose WorkloadEntry, sidecar Secret or sidecar token cannot be
// written (the two branches written at once after the registration) leaves
// nothing behind: the new registration is removed, and with it whatever
// the other branch wrote.
func TestFailureAfterTheRegistrationLeavesNothing(t *testing.T) {
	tests := []struct {
		name string
		fail func(obj client.Object, subResource string) bool
	}{
		{name: "WorkloadEntry", fail: func(obj client.Object, _ string) bool {
			_, ok := obj.(*istionetworkingv1.WorkloadEntry)
			return ok
		}},
		{name: "sidecar Secret", fail: func(obj client.Object, _ string) bool {
			_, ok := obj.(*corev1.Secret)
			return ok
		}},
		{name: "sidecar token", fail: func(_ client.Object, subResource string) bool { return subResource == "token" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			wg := createGroup(t, ns)
			_, err := newRegistrar(t, injectedFailure(tt.fail)).Write(t.Context(), Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
			if err == nil || !strings.Contains(err.Error(), "injected failure") {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			waitNothingLeft(t, ns)
		})
	}
}

func TestFailedCleanUpIsRepairedByTheNextRegister(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	failing := injectedFailure(func(obj client.Object, _ string) bool {
		_, ok := obj.(*istionetworkingv1.WorkloadEntry)
		return ok
	})
	// When even the clean-up fails, the next register completes the
	// registration instead of leaving it half-made.
	noDelete := interceptor.NewClient(failing, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return apierrors.NewForbidden(runtimev1alpha1.Resource("workloadautoregistrations"), obj.GetName(), errors.New("injected delete failure"))
		},
	})
	if _, err := newRegistrar(t, noDelete).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")}); err == nil {
		t.Fatal("want the injected failure")
	}
	res, err := newRegistrar(t, nil).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created || res.WorkloadEntry.Spec.Address != "172.31.5.254" || res.SidecarToken == nil {
		t.Errorf("repair: created=%v entry=%v token=%v", res.Created, res.WorkloadEntry, res.SidecarToken != nil)
	}
}

// waitNothingLeft waits until ns holds no live registration, no WorkloadEntry
// of Embark's and no sidecar Secret (the garbage collector removes what a
// removed registration owned).
func waitNothingLeft(t *testing.T, ns string) {
	t.Helper()
	err := fixtures.Poll(t.Context(), fixtures.Interval, 30*time.Second, func() error {
		if left := leftIn(t, ns); left != "" {
			return errors.New("left behind: " + left)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// leftIn names what a failed Register left in ns ("" when nothing).
func leftIn(t *testing.T, ns string) string {
	t.Helper()
	ctx := t.Context()
	var left []string
	wars := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	entries := &istionetworkingv1.WorkloadEntryList{}
	secrets := &corev1.SecretList{}
	if err := errors.Join(env.Client.List(ctx, wars, client.InNamespace(ns)), env.Client.List(ctx, entries, client.InNamespace(ns)),
		env.Client.List(ctx, secrets, client.InNamespace(ns), client.MatchingLabels{LabelSidecarCredential: "true"})); err != nil {
		return err.Error()
	}
	for _, w := range wars.Items {
		if w.DeletionTimestamp == nil {
			left = append(left, "registration "+w.Name)
		}
	}
	for _, e := range entries.Items {
		if _, managed := OwnedBy(e.OwnerReferences, ""); managed {
			left = append(left, "WorkloadEntry "+e.Name)
		}
	}
	for _, s := range secrets.Items {
		left = append(left, "Secret "+s.Name)
	}
	return strings.Join(left, ", ")
}

func TestInvalidRegistrationsWriteNothing(t *testing.T) {
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	tests := []struct {
		name    string
		mutate  func(*Request)
		wantErr error
		wantMsg string
	}{
		{
			name:    "label overriding the template",
			mutate:  func(r *Request) { r.Registration.Workload.Labels = map[string]string{"app": "reviews"} },
			wantErr: ErrInvalidRegistration, wantMsg: "registration.workload.labels[app]",
		},
		{
			name:    "no address of the connectedOver type",
			mutate:  func(r *Request) { r.Registration.Settings.ConnectedOver = runtimev1alpha1.AddressTypeInternet },
			wantErr: ErrInvalidRegistration, wantMsg: "no host address of type INTERNET",
		},
		{
			name:    "not an IP",
			mutate:  func(r *Request) { r.Registration.Host.Addresses[0].IP = "ratings.example" },
			wantErr: ErrInvalidRegistration, wantMsg: "registration.host.addresses[0].ip",
		},
		{
			name:    "no identity",
			mutate:  func(r *Request) { r.Identity = runtimev1alpha1.WorkloadIdentity{} },
			wantErr: ErrInvalidRegistration, wantMsg: "no verified identity",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")}
			tt.mutate(&req)
			_, err := newRegistrar(t, nil).Write(t.Context(), req)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("err = %v, want %v mentioning %q", err, tt.wantErr, tt.wantMsg)
			}
			assertNoRegistrations(t, ns)
		})
	}
}

func TestRegistrationNameHeldByAnotherIdentityIsRefused(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	r := newRegistrar(t, nil)
	res, err := r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
	if err != nil {
		t.Fatal(err)
	}
	// Forge the stored identity, as a name collision would look: another
	// instance under the name.
	res.Registration.Spec.Identity.AWS.EC2.InstanceID = "i-0fedcba9876543210"
	if err := env.Client.Update(ctx, res.Registration); err != nil {
		t.Fatal(err)
	}
	_, err = r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
	if !errors.Is(err, ErrIdentityConflict) {
		t.Errorf("err = %v, want ErrIdentityConflict", err)
	}
}

func assertNoRegistrations(t *testing.T, ns string) {
	t.Helper()
	wars := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(t.Context(), wars, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, w := range wars.Items {
		if w.DeletionTimestamp == nil {
			t.Errorf("registration %s left behind", w.Name)
		}
	}
	entries := &istionetworkingv1.WorkloadEntryList{}
	if err := env.Client.List(t.Context(), entries, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries.Items {
		if _, managed := OwnedBy(e.OwnerReferences, ""); managed {
			t.Errorf("WorkloadEntry %s left behind", e.Name)
		}
	}
}

// Beside a revisioned istiod the registration and its WorkloadEntry record
// the revision as an annotation, and the entry never carries istio.io/rev
// (istiod takes an entry labelled with another revision than its own
// nowhere); registering again after the revision changed moves the
// annotation, and removes a label an earlier version wrote.
func TestRegisterRecordsTheIstioRevision(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	register := func(rev string, of func(context.Context, *istionetworkingv1.WorkloadGroup) string) *Result {
		t.Helper()
		r, err := NewRegistrar(Options{Client: env.Client, Cache: cached, Recorder: recorder, Logger: fixtures.Logger(t), Revision: rev, RevisionOf: of})
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity(fixtures.InstanceID), Registration: fixtures.Registration("172.31.5.254")})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// RevisionOf (several istiod revisions) chooses per group, over Revision.
	chosen := func(rev string) func(context.Context, *istionetworkingv1.WorkloadGroup) string {
		return func(_ context.Context, g *istionetworkingv1.WorkloadGroup) string {
			if g.Name != wg.Name {
				t.Errorf("RevisionOf asked for group %s, want %s", g.Name, wg.Name)
			}
			return rev
		}
	}
	for _, step := range []struct {
		configured, want string
		of               func(context.Context, *istionetworkingv1.WorkloadGroup) string
	}{
		{configured: "canary", want: "canary"}, {configured: "stable", want: "stable"}, {configured: "default", want: ""},
		{configured: "stable", of: chosen("canary"), want: "canary"}, {configured: "stable", of: chosen("default"), want: ""},
	} {
		res := register(step.configured, step.of)
		if got := res.Registration.Annotations[AnnotationIstioRevision]; got != step.want {
			t.Errorf("revision %q: registration records %q, want %q", step.configured, got, step.want)
		}
		we := &istionetworkingv1.WorkloadEntry{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: seedName}, we); err != nil {
			t.Fatal(err)
		}
		if got, ok := we.Annotations[AnnotationIstioRevision]; got != step.want || ok != (step.want != "") {
			t.Errorf("revision %q: WorkloadEntry records revision %q (annotated: %v), want %q", step.configured, got, ok, step.want)
		}
		assertNoRevisionLabel(t, we, "revision "+step.configured)
	}
	// An entry an earlier version labelled loses the label when the
	// workload registers again.
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: seedName}, we); err != nil {
		t.Fatal(err)
	}
	we.Labels[LabelRevision], we.Spec.Labels[LabelRevision] = "canary", "canary"
	if err := env.Client.Update(ctx, we); err != nil {
		t.Fatal(err)
	}
	register("canary", nil)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: seedName}, we); err != nil {
		t.Fatal(err)
	}
	assertNoRevisionLabel(t, we, "registered again after an earlier version labelled the entry")
	if got := we.Annotations[AnnotationIstioRevision]; got != "canary" {
		t.Errorf("registered again: WorkloadEntry records revision %q, want canary", got)
	}
}

// assertNoRevisionLabel fails when we or its endpoint carries istio.io/rev.
func assertNoRevisionLabel(t *testing.T, we *istionetworkingv1.WorkloadEntry, when string) {
	t.Helper()
	if rev, ok := we.Labels[LabelRevision]; ok {
		t.Errorf("%s: WorkloadEntry labelled istio.io/rev=%q", when, rev)
	}
	if rev, ok := we.Spec.Labels[LabelRevision]; ok {
		t.Errorf("%s: WorkloadEntry's endpoint labelled istio.io/rev=%q", when, rev)
	}
}

// The same workload registering again with other proven details keeps its
// registration, which then holds the identity proven last: a check turned on
// for a live fleet (or an STS proof presented this time) does not lock the
// workload out of its own registration.
func TestRegisterAgainWithOtherProvenDetailsKeepsTheRegistration(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	r := newRegistrar(t, nil)
	req := Request{Group: wg, Identity: fixtures.AWSIdentity(fixtures.InstanceID), Registration: fixtures.Registration("172.31.5.254"), SessionHash: SessionHash("agent")}
	first, err := r.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	req.Identity = fixtures.AWSIdentity(fixtures.InstanceID)
	req.Identity.AWS.EC2.IAMRole = "ratings-vm"
	again, err := r.Write(ctx, req)
	if err != nil {
		t.Fatalf("register with an STS-proven role: %v", err)
	}
	if again.Created || again.Registration.UID != first.Registration.UID {
		t.Fatalf("created=%v uid=%s, want the registration %s reused", again.Created, again.Registration.UID, first.Registration.UID)
	}
	stored := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(first.Registration), stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.Spec.Identity.AWS.EC2.IAMRole; got != "ratings-vm" {
		t.Errorf("stored IAM role = %q, want the identity proven last (ratings-vm)", got)
	}
}
