package lifecycle

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/testenv"
)

// The lifecycle runs against a real API server: registrations, WorkloadEntries,
// Leases and Events are the API server's.
var (
	env      *testenv.Env
	recorder record.EventRecorder
)

// TestMain fails the package when a goroutine (a sweeper worker, a lease
// heartbeat) outlives the tests.
func TestMain(m *testing.M) {
	os.Exit(testenv.CheckLeaks(testenv.Run(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		recorder, err = env.EventRecorder(ctx, "embark-lifecycle-test")
		return err
	})))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func ec2Identity(instance string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
		Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
		EC2: &runtimev1alpha1.EC2Identity{InstanceID: instance},
	}}
}

func registration(ip string) runtimev1alpha1.Registration {
	return runtimev1alpha1.Registration{
		Agent:    runtimev1alpha1.AgentInfo{Version: "v1.4.0"},
		Host:     runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{{IP: ip, Type: runtimev1alpha1.AddressTypeVPC}}},
		Settings: runtimev1alpha1.Settings{ConnectedOver: runtimev1alpha1.AddressTypeVPC},
		Sidecar:  runtimev1alpha1.SidecarInfo{Istio: runtimev1alpha1.IstioSidecarInfo{Version: "1.9.8-15bc6e5e32"}},
		Workload: runtimev1alpha1.WorkloadInfo{Labels: map[string]string{"version": "v5"}},
	}
}

func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("%s still exists: %v", obj.GetName(), err)
	}
}

func waitForEvent(t *testing.T, ns, name, reason, contains string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := env.Client.List(ctx, events, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.name", name)}); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && strings.Contains(e.Message, contains) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no %s event on %s mentioning %q: %v", reason, name, contains, err)
	}
}
