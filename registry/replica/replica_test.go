package replica

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

// Leases are the API server's: these tests run against a real one.
var env *testenv.Env

// TestMain fails the package when a goroutine (an informer, a heartbeat)
// outlives the tests.
func TestMain(m *testing.M) {
	os.Exit(testenv.CheckLeaks(testenv.Run(m, testenv.Options{}, &env)))
}

func kubeClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

func TestLeaseName(t *testing.T) {
	tests := []struct {
		name    string
		replica string
		want    string
	}{
		{name: "pod name", replica: "onboarding-endpoint-7d9f8c6b5-x2x4z", want: "embark-replica-onboarding-endpoint-7d9f8c6b5-x2x4z"},
		{name: "upper case host name", replica: "VM-Host_1", want: ""},
		{name: "very long", replica: strings.Repeat("a", 300), want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := LeaseName(tt.replica)
			if tt.want != "" && got != tt.want {
				t.Errorf("LeaseName = %q, want %q", got, tt.want)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("%q is not a valid name: %v", got, errs)
			}
			if again := LeaseName(tt.replica); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
	}
}

// A replica's heartbeat takes a Lease left by an earlier process of the same
// name over as a new incarnation, renews it, and deletes it on release; a
// watching replica sees it alive, then gone.
func TestHeartbeatAndLeases(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	kube := kubeClient(t)
	log := slog.New(slog.DiscardHandler)

	old := time.Now().Add(-time.Hour)
	left := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName("replica-b"), Namespace: ns, Labels: map[string]string{LabelLease: "true"}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("replica-b"), LeaseDurationSeconds: ptr.To(int32(40)),
			AcquireTime: &metav1.MicroTime{Time: old}, RenewTime: &metav1.MicroTime{Time: old},
		},
	}
	if err := env.Client.Create(ctx, left); err != nil {
		t.Fatal(err)
	}

	watcher := NewLeases(kube, ns, nil, log)
	watchCtx, stopWatching := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- watcher.Run(watchCtx) }()
	defer func() {
		stopWatching()
		if err := <-watched; err != nil {
			t.Errorf("Leases.Run: %v", err)
		}
	}()
	if !watcher.WaitForSync(ctx) {
		t.Fatal("Leases never synced")
	}
	gone := make(chan string, 4)
	defer watcher.OnGone(func(r string) { gone <- r })()
	if st := watcher.Lookup("replica-b"); !st.Found || st.Alive {
		t.Errorf("the left Lease: %+v, want found and expired", st)
	}
	if watcher.OthersAlive("replica-a") {
		t.Error("OthersAlive with only an expired Lease of another replica")
	}

	hb, err := NewHeartbeat(HeartbeatOptions{Leases: kube.CoordinationV1(), Namespace: ns, Replica: "replica-b",
		Duration: 2 * time.Second, Interval: 200 * time.Millisecond, Logger: log, Writer: write.New(write.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: ns, Name: LeaseName("replica-b")}
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, key, lease); err != nil {
		t.Fatal(err)
	}
	if !lease.Spec.AcquireTime.After(old.Add(time.Minute)) || ptr.Deref(lease.Spec.LeaseTransitions, 0) != 1 || ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) != 2 {
		t.Errorf("the new process did not take the Lease over as a new incarnation: %+v", lease.Spec)
	}
	runCtx, stopRunning := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); hb.Run(runCtx) }()
	fixtures.Eventually(t, 30*time.Second, "the Lease renewed", func() bool {
		cur := &coordinationv1.Lease{}
		return env.Client.Get(ctx, key, cur) == nil && cur.Spec.RenewTime.After(lease.Spec.RenewTime.Time) && cur.Spec.AcquireTime.Equal(lease.Spec.AcquireTime)
	})
	fixtures.Eventually(t, 30*time.Second, "replica-b seen alive", func() bool { return watcher.IsAlive("replica-b") })
	if watcher.IsAlive("replica-c") {
		t.Error("a replica without a Lease is alive")
	}
	if !watcher.OthersAlive("replica-a") {
		t.Error("replica-a finds no other replica alive while replica-b is")
	}
	if watcher.OthersAlive("replica-b") {
		t.Error("replica-b takes its own Lease for another replica's")
	}

	stopRunning()
	<-ran
	hb.Release(ctx)
	if err := env.Client.Get(ctx, key, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Lease after Release: %v, want NotFound", err)
	}
	select {
	case r := <-gone:
		if r != "replica-b" {
			t.Errorf("OnGone(%q), want replica-b", r)
		}
	case <-time.After(30 * time.Second):
		t.Error("OnGone not called after the Lease was deleted")
	}
	if watcher.IsAlive("replica-b") {
		t.Error("replica-b alive after its release")
	}
}
