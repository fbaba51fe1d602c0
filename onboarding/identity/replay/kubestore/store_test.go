package kubestore_test

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/onboarding/identity/replay/kubestore"
	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/test/testenv"
)

// The store's decisions are the API server's: these tests run against a
// real kube-apiserver and etcd.
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{}, &env))
}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// newStore is replica's store in ns on cfg's API server.
func newStore(t *testing.T, cfg *rest.Config, ns, replica string, c *clock) *kubestore.Store {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kubestore.New(kubestore.Options{Leases: cs.CoordinationV1(), Namespace: ns, Replica: replica, Clock: c.Now,
		Writer: write.New(write.Options{Backoff: wait.Backoff{Duration: time.Millisecond, Steps: 1}})})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReserveAcrossReplicas(t *testing.T) {
	ns := env.Namespace(t)
	c := &clock{now: time.Now()}
	a, b := newStore(t, env.Config, ns, "a", c), newStore(t, env.Config, ns, "b", c)
	expiry := c.Now().Add(time.Minute)
	steps := []struct {
		name      string
		store     *kubestore.Store
		key       string
		advance   time.Duration
		wantFresh bool
	}{
		{name: "first use at A", store: a, key: "k1", wantFresh: true},
		{name: "same key at B", store: b, key: "k1", wantFresh: false},
		{name: "same key at A", store: a, key: "k1", wantFresh: false},
		{name: "another key at B", store: b, key: "k2", wantFresh: true},
		{name: "k1 once expired, at B", store: b, key: "k1", advance: 2 * time.Minute, wantFresh: true},
		{name: "k1 again at A", store: a, key: "k1", wantFresh: false},
	}
	for _, st := range steps {
		c.Add(st.advance)
		if st.advance > 0 {
			expiry = c.Now().Add(time.Minute)
		}
		fresh, err := st.store.Reserve(t.Context(), st.key, expiry)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if fresh != st.wantFresh {
			t.Errorf("%s: fresh %v, want %v", st.name, fresh, st.wantFresh)
		}
	}
	l, err := kubernetes.NewForConfigOrDie(env.Config).CoordinationV1().Leases(ns).Get(t.Context(), kubestore.Name("k1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := *l.Spec.HolderIdentity; got != "b" {
		t.Errorf("k1's Lease is held by %q, want the replica that accepted it last, b", got)
	}
}

func TestReserveConcurrentlyAcceptsOnce(t *testing.T) {
	ns := env.Namespace(t)
	c := &clock{now: time.Now()}
	stores := []*kubestore.Store{newStore(t, env.Config, ns, "a", c), newStore(t, env.Config, ns, "b", c), newStore(t, env.Config, ns, "c", c)}
	var mu sync.Mutex
	accepted := 0
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			fresh, err := s.Reserve(t.Context(), "race", c.Now().Add(time.Minute))
			if err != nil {
				t.Error(err)
			}
			if fresh {
				mu.Lock()
				accepted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if accepted != 1 {
		t.Errorf("accepted %d times by %d replicas at once, want once", accepted, len(stores))
	}
}

func TestCollectDeletesExpiredOnly(t *testing.T) {
	ns := env.Namespace(t)
	c := &clock{now: time.Now()}
	s := newStore(t, env.Config, ns, "a", c)
	for key, life := range map[string]time.Duration{"short-1": time.Minute, "short-2": time.Minute, "long": time.Hour} {
		if _, err := s.Reserve(t.Context(), key, c.Now().Add(life)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Collect(t.Context()); err != nil || n != 0 {
		t.Fatalf("Collect before any expiry: deleted %d, %v; want 0", n, err)
	}
	c.Add(2 * time.Minute)
	if n, err := s.Collect(t.Context()); err != nil || n != 2 {
		t.Fatalf("Collect after two expired: deleted %d, %v; want 2", n, err)
	}
	list, err := kubernetes.NewForConfigOrDie(env.Config).CoordinationV1().Leases(ns).List(t.Context(), metav1.ListOptions{LabelSelector: kubestore.LabelUsedCredential})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != kubestore.Name("long") {
		t.Errorf("Leases left: %d, want only long's", len(list.Items))
	}
	if fresh, err := s.Reserve(t.Context(), "long", c.Now().Add(time.Hour)); err != nil || fresh {
		t.Errorf("the unexpired key after Collect: fresh %v, %v; want a replay", fresh, err)
	}
}

func TestReserveWithoutAPIServerIsUnavailable(t *testing.T) {
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://127.0.0.1:1" // nothing listens there
	cfg.Timeout = 2 * time.Second
	c := &clock{now: time.Now()}
	s := newStore(t, cfg, "default", "a", c)
	fresh, err := s.Reserve(t.Context(), "k", c.Now().Add(time.Minute))
	if fresh || !errors.Is(err, replay.ErrUnavailable) {
		t.Errorf("Reserve without an API server: fresh %v, error %v; want not fresh and replay.ErrUnavailable", fresh, err)
	}
}

func TestNewRequiresOptions(t *testing.T) {
	cs := kubernetes.NewForConfigOrDie(env.Config)
	for _, tc := range []struct {
		name string
		opts kubestore.Options
	}{
		{name: "no client", opts: kubestore.Options{Namespace: "ns", Replica: "a"}},
		{name: "no namespace", opts: kubestore.Options{Leases: cs.CoordinationV1(), Replica: "a"}},
		{name: "no replica", opts: kubestore.Options{Leases: cs.CoordinationV1(), Namespace: "ns"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := kubestore.New(tc.opts); err == nil {
				t.Error("New accepted incomplete options")
			}
		})
	}
}
