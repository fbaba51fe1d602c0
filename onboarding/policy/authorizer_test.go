package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// The endpoint hands the Authorizer its informer cache.
var _ client.Reader = cache.Cache(nil)

// startCache starts a controller-runtime cache over the test control plane
// and stops it when the test ends.
func startCache(t *testing.T) cache.Cache {
	t.Helper()
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatalf("create cache: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache: %v", err)
		}
	})
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return c
}

// startRecorder returns a core/v1 Event recorder writing to the test control
// plane through client-go's broadcaster (with its default correlator).
func startRecorder(t *testing.T) record.EventRecorder {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatalf("create clientset: %v", err)
	}
	b := record.NewBroadcaster(record.WithContext(t.Context()))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	return b.NewRecorder(env.Scheme, corev1.EventSource{Component: "embark-onboarding-endpoint"})
}

func newAuthorizer(t *testing.T, reader client.Reader, recorder record.EventRecorder, opts ...Option) *Authorizer {
	t.Helper()
	a, err := NewAuthorizer(reader, recorder, append([]Option{WithLogger(fixtures.DebugLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// createSeedGroup creates the example WorkloadGroup "ratings" in ns.
func createSeedGroup(t *testing.T, ns string) *networkingv1.WorkloadGroup {
	t.Helper()
	wg := seedGroup(t)
	wg.Namespace = ns
	if err := env.Client.Create(t.Context(), wg); err != nil {
		t.Fatalf("create WorkloadGroup: %v", err)
	}
	return wg
}

// createPolicy creates a copy of p in ns.
func createPolicy(t *testing.T, p authorizationv1alpha1.OnboardingPolicy, ns string) *authorizationv1alpha1.OnboardingPolicy {
	t.Helper()
	obj := p.DeepCopy()
	obj.Namespace = ns
	if err := env.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create OnboardingPolicy %s: %v", obj.Name, err)
	}
	return obj
}

// waitForCache polls until the cache holds obj at obj's resourceVersion.
func waitForCache(t *testing.T, c cache.Cache, obj client.Object) {
	t.Helper()
	got := obj.DeepCopyObject().(client.Object)
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), got)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && got.GetResourceVersion() == obj.GetResourceVersion(), err
	})
	if err != nil {
		t.Fatalf("cache never saw %T %s at resourceVersion %s: %v", obj, obj.GetName(), obj.GetResourceVersion(), err)
	}
}

// waitForCacheDeletion polls until the cache no longer holds obj.
func waitForCacheDeletion(t *testing.T, c cache.Cache, obj client.Object) {
	t.Helper()
	got := obj.DeepCopyObject().(client.Object)
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), got)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("cache still holds %T %s: %v", obj, obj.GetName(), err)
	}
}

// deniedEvents lists the OnboardingDenied Events about wg in the API server.
func deniedEvents(ctx context.Context, wg *networkingv1.WorkloadGroup) ([]corev1.Event, error) {
	var list corev1.EventList
	if err := env.Client.List(ctx, &list, client.InNamespace(wg.Namespace)); err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.UID == wg.UID && e.Reason == ReasonOnboardingDenied {
			out = append(out, e)
		}
	}
	return out, nil
}

func TestAuthorizeMissingWorkloadGroup(t *testing.T) {
	ns := env.Namespace(t)
	_, narrow := seedPolicies(t)
	createPolicy(t, narrow, ns)
	rec := record.NewFakeRecorder(10)
	a := newAuthorizer(t, startCache(t), rec)

	tests := []struct {
		name string
		call func() error
	}{
		{name: "Authorize", call: func() error {
			_, err := a.Authorize(t.Context(), ns, "ratings", ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"))
			return err
		}},
		{name: "RequiresIAMRoleProof", call: func() error {
			_, err := a.RequiresIAMRoleProof(t.Context(), ns, "ratings")
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, ErrWorkloadGroupNotFound) {
				t.Fatalf("err = %v, want ErrWorkloadGroupNotFound", err)
			}
			if errors.Is(err, ErrDenied) {
				t.Errorf("err %v is also ErrDenied", err)
			}
			if want := ns + "/ratings"; !strings.Contains(err.Error(), want) {
				t.Errorf("err = %q, want it to name %s", err, want)
			}
		})
	}
	if len(rec.Events) != 0 {
		t.Errorf("recorded %d Events for a missing WorkloadGroup", len(rec.Events))
	}
}

// A denial records a Warning Event on the WorkloadGroup; repeats of the same
// denial are counted on that one Event by client-go's correlator.
func TestAuthorizeDenialRecordsEvent(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	c := startCache(t)
	wg := createSeedGroup(t, ns)
	_, narrow := seedPolicies(t)
	p := createPolicy(t, narrow, ns)
	waitForCache(t, c, wg)
	waitForCache(t, c, p)
	// Interval 0: every denial goes to the recorder, to show what client-go
	// does with repeats.
	a := newAuthorizer(t, c, startRecorder(t), WithEventInterval(0))

	id := ec2("123456789012", "us-east-2", "us-east-2a", "ratings-role")
	d, err := a.Authorize(ctx, ns, "ratings", id)
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("Authorize: err = %v, want ErrDenied", err)
	}
	var de *DeniedError
	if !errors.As(err, &de) || de.Decision.Allowed || d.Allowed {
		t.Fatalf("Authorize: err %v is not a *DeniedError of a denial", err)
	}
	wantMsg := "aws partition aws account 123456789012 region us-east-2 zone us-east-2a instance i-1234567890abcdef0 iam role ratings-role is not authorized to join WorkloadGroup " +
		ns + "/ratings: no rule of the 1 OnboardingPolicy in namespace " + ns + " allows it; closest: policy " + narrowPolicy + "/rule 0: zone us-east-2a not in [us-east-2b]"
	if err.Error() != wantMsg {
		t.Errorf("error message\n  %s\nwant\n  %s", err, wantMsg)
	}

	var events []corev1.Event
	poll := func(want int32) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			events, err = deniedEvents(ctx, wg)
			return len(events) == 1 && events[0].Count == want, err
		})
		if err != nil {
			t.Fatalf("want one OnboardingDenied Event with count %d, have %+v: %v", want, events, err)
		}
	}
	poll(1)
	e := events[0]
	if e.Type != corev1.EventTypeWarning || e.Message != wantMsg {
		t.Errorf("Event type %q message\n  %s\nwant Warning\n  %s", e.Type, e.Message, wantMsg)
	}
	if e.InvolvedObject.Kind != "WorkloadGroup" || e.InvolvedObject.APIVersion != "networking.istio.io/v1" ||
		e.InvolvedObject.Name != "ratings" || e.InvolvedObject.Namespace != ns {
		t.Errorf("Event is about %+v, want the WorkloadGroup", e.InvolvedObject)
	}

	// The VM retries: still one Event, its count goes up.
	for range 4 {
		if _, err := a.Authorize(ctx, ns, "ratings", id); !errors.Is(err, ErrDenied) {
			t.Fatalf("Authorize: err = %v, want ErrDenied", err)
		}
	}
	poll(5)
}

// Identical denials within the event interval reach the recorder once.
func TestAuthorizeHoldsBackRepeatedEvents(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	createSeedGroup(t, ns)
	_, narrow := seedPolicies(t)
	createPolicy(t, narrow, ns)
	clk := clocktesting.NewFakePassiveClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := record.NewFakeRecorder(100)
	// env.Client reads the API server directly: this test is about the
	// Authorizer's own rate limit, not the cache.
	a := newAuthorizer(t, env.Client, rec, WithClock(clk), WithEventInterval(time.Minute))

	zoneA := ec2("123456789012", "us-east-2", "us-east-2a", "ratings-role")
	zoneC := ec2("123456789012", "us-east-2", "us-east-2c", "ratings-role")
	steps := []struct {
		name        string
		advance     time.Duration
		id          runtimev1alpha1.WorkloadIdentity
		wantAllowed bool
		wantEvents  int
	}{
		{name: "first denial", id: zoneA, wantEvents: 1},
		{name: "repeat 10s later", advance: 10 * time.Second, id: zoneA},
		{name: "repeat 40s later", advance: 30 * time.Second, id: zoneA},
		{name: "another denial message", id: zoneC, wantEvents: 1},
		{name: "repeat after the interval", advance: 30 * time.Second, id: zoneA, wantEvents: 1},
		{name: "allowed", id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"), wantAllowed: true},
	}
	for _, s := range steps {
		clk.SetTime(clk.Now().Add(s.advance))
		_, err := a.Authorize(ctx, ns, "ratings", s.id)
		if s.wantAllowed && err != nil || !s.wantAllowed && !errors.Is(err, ErrDenied) {
			t.Fatalf("%s: err = %v, want allowed %v", s.name, err, s.wantAllowed)
		}
		got := len(rec.Events)
		for range got {
			if e := <-rec.Events; !strings.HasPrefix(e, "Warning OnboardingDenied ") {
				t.Errorf("%s: Event %q", s.name, e)
			}
		}
		if got != s.wantEvents {
			t.Errorf("%s: %d Events recorded, want %d", s.name, got, s.wantEvents)
		}
	}
}

func TestShouldRecordStaysBounded(t *testing.T) {
	rec := record.NewFakeRecorder(1)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	a, err := NewAuthorizer(env.Client, rec, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxTrackedEvents + 100 {
		if !a.shouldRecord(eventKey{namespace: "ns", name: "g", message: fmt.Sprint(i)}) {
			t.Fatalf("message %d held back", i)
		}
	}
	if n := len(a.recent); n > maxTrackedEvents {
		t.Errorf("tracking %d Events, more than %d", n, maxTrackedEvents)
	}
}

func TestNewAuthorizerRejectsNil(t *testing.T) {
	tests := []struct {
		name     string
		reader   client.Reader
		recorder record.EventRecorder
		wantErr  string
	}{
		{name: "nil reader", recorder: record.NewFakeRecorder(1), wantErr: "reader is nil"},
		{name: "nil recorder", reader: env.Client, wantErr: "recorder is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewAuthorizer(tt.reader, tt.recorder)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// Creating, updating and deleting policies (and relabelling the group) take
// effect through the cache, without a new Authorizer.
func TestPolicyChangesTakeEffectWithoutRestart(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	c := startCache(t)
	rec := record.NewFakeRecorder(100)
	a := newAuthorizer(t, c, rec)
	wg := createSeedGroup(t, ns)
	waitForCache(t, c, wg)
	id := ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role")
	_, narrow := seedPolicies(t)
	var p *authorizationv1alpha1.OnboardingPolicy

	steps := []struct {
		name        string
		change      func(t *testing.T)
		wantAllowed bool
		wantMessage string
		wantProof   bool
	}{
		{
			name:        "no policy yet",
			change:      func(t *testing.T) {},
			wantMessage: "no OnboardingPolicy in namespace " + ns,
		},
		{
			name: "policy created",
			change: func(t *testing.T) {
				p = createPolicy(t, narrow, ns)
				waitForCache(t, c, p)
			},
			wantAllowed: true, wantMessage: "by policy " + narrowPolicy + "/rule 0", wantProof: true,
		},
		{
			name: "policy updated to another zone",
			change: func(t *testing.T) {
				p.Spec.Allow[0].Workloads[0].AWS.Zones = []string{"us-east-2a"}
				if err := env.Client.Update(ctx, p); err != nil {
					t.Fatalf("update policy: %v", err)
				}
				waitForCache(t, c, p)
			},
			wantMessage: "policy " + narrowPolicy + "/rule 0: zone us-east-2b not in [us-east-2a]", wantProof: true,
		},
		{
			name: "policy updated back, group relabelled",
			change: func(t *testing.T) {
				p.Spec.Allow[0].Workloads[0].AWS.Zones = []string{"us-east-2b"}
				if err := env.Client.Update(ctx, p); err != nil {
					t.Fatalf("update policy: %v", err)
				}
				wg.Labels = map[string]string{"app": "details"}
				if err := env.Client.Update(ctx, wg); err != nil {
					t.Fatalf("update WorkloadGroup: %v", err)
				}
				waitForCache(t, c, p)
				waitForCache(t, c, wg)
			},
			wantMessage: "WorkloadGroup labels app=details not selected by matchLabels app=ratings",
		},
		{
			name: "group labelled back",
			change: func(t *testing.T) {
				wg.Labels = map[string]string{"app": "ratings"}
				if err := env.Client.Update(ctx, wg); err != nil {
					t.Fatalf("update WorkloadGroup: %v", err)
				}
				waitForCache(t, c, wg)
			},
			wantAllowed: true, wantMessage: "by policy " + narrowPolicy + "/rule 0", wantProof: true,
		},
		{
			name: "policy deleted",
			change: func(t *testing.T) {
				if err := env.Client.Delete(ctx, p); err != nil {
					t.Fatalf("delete policy: %v", err)
				}
				waitForCacheDeletion(t, c, p)
			},
			wantMessage: "no OnboardingPolicy in namespace " + ns,
		},
	}
	for _, s := range steps {
		s.change(t)
		d, err := a.Authorize(ctx, ns, "ratings", id)
		if s.wantAllowed != (err == nil) || d.Allowed != s.wantAllowed {
			t.Fatalf("%s: Allowed = %v, err = %v; want allowed %v", s.name, d.Allowed, err, s.wantAllowed)
		}
		if !s.wantAllowed && !errors.Is(err, ErrDenied) {
			t.Errorf("%s: err = %v, want ErrDenied", s.name, err)
		}
		if msg := d.Message(); !strings.Contains(msg, s.wantMessage) {
			t.Errorf("%s: message\n  %s\nlacks\n  %s", s.name, msg, s.wantMessage)
		}
		proof, err := a.RequiresIAMRoleProof(ctx, ns, "ratings")
		if err != nil || proof != s.wantProof {
			t.Errorf("%s: RequiresIAMRoleProof = %v, %v; want %v", s.name, proof, err, s.wantProof)
		}
	}
}

// A policy in another namespace allows nothing here, even through the same
// cache.
func TestAuthorizeIgnoresPoliciesOfOtherNamespaces(t *testing.T) {
	ctx := t.Context()
	ns, other := env.Namespace(t), env.Namespace(t)
	c := startCache(t)
	anyEC2, _ := seedPolicies(t)
	wg := createSeedGroup(t, ns)
	createSeedGroup(t, other)
	p := createPolicy(t, anyEC2, other)
	waitForCache(t, c, wg)
	waitForCache(t, c, p)
	a := newAuthorizer(t, c, record.NewFakeRecorder(10))
	id := ec2("123456789012", "us-east-2", "us-east-2b", "")

	tests := []struct {
		name        string
		namespace   string
		wantAllowed bool
		wantMessage string
	}{
		{name: "group in the policy's namespace", namespace: other, wantAllowed: true, wantMessage: "by policy " + anyPolicy + "/rule 0"},
		{name: "group in another namespace", namespace: ns, wantMessage: "no OnboardingPolicy in namespace " + ns},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := a.Authorize(ctx, tt.namespace, "ratings", id)
			if d.Allowed != tt.wantAllowed || (err == nil) != tt.wantAllowed {
				t.Fatalf("Allowed = %v, err = %v; want %v", d.Allowed, err, tt.wantAllowed)
			}
			if !strings.Contains(d.Message(), tt.wantMessage) {
				t.Errorf("message %q lacks %q", d.Message(), tt.wantMessage)
			}
		})
	}
}

// An Authorizer watching the policy informer keeps the namespace's Index
// between requests and builds it again after each change the informer
// reports: creations, updates and deletions take effect.
func TestWatchedAuthorizerFollowsPolicyChanges(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	c := startCache(t)
	a := newAuthorizer(t, c, record.NewFakeRecorder(100))
	if err := a.WatchPolicies(ctx, c); err != nil {
		t.Fatal(err)
	}
	if a.policyRV == nil {
		t.Fatal("the cache's informer does not tell its resource version: an Index could be kept past a change its handler has not been told of yet")
	}
	wg := createSeedGroup(t, ns)
	waitForCache(t, c, wg)
	id := ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role")
	_, narrow := seedPolicies(t)

	// eventually polls Authorize until its message holds want (the
	// informer calls the Authorizer's handler after updating its store).
	eventually := func(step string, wantAllowed bool, want string) {
		t.Helper()
		var last Decision
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			d, err := a.Authorize(ctx, ns, "ratings", id)
			if err != nil && !errors.Is(err, ErrDenied) {
				return false, err
			}
			last = d
			return d.Allowed == wantAllowed && strings.Contains(d.Message(), want), nil
		})
		if err != nil {
			t.Fatalf("%s: last decision %q (allowed %v), want allowed %v with %q: %v", step, last.Message(), last.Allowed, wantAllowed, want, err)
		}
	}
	eventually("no policy", false, "no OnboardingPolicy in namespace "+ns)
	p := createPolicy(t, narrow, ns)
	eventually("created", true, "by policy "+narrowPolicy+"/rule 0")

	first, err := a.index(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	again, err := a.index(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if first != again {
		t.Error("the Index was built again although no policy changed")
	}

	p.Spec.Allow[0].Workloads[0].AWS.Zones = []string{"us-east-2a"}
	if err := env.Client.Update(ctx, p); err != nil {
		t.Fatalf("update policy: %v", err)
	}
	eventually("updated", false, "zone us-east-2b not in [us-east-2a]")
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatalf("delete policy: %v", err)
	}
	eventually("deleted", false, "no OnboardingPolicy in namespace "+ns)
}
