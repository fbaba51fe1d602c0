package lifecycle

import (
	"context"
	"os"
	"testing"

	"k8s.io/client-go/tools/record"

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
