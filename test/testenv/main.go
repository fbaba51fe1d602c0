package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Main starts a control plane for a test package, runs setup (if any) with a
// context that stays live while the tests run, runs the tests and stops
// everything. Call it from TestMain:
//
//	var env *testenv.Env
//	func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }
//
// A control plane that cannot start, or a setup that fails, fails the
// package: tests are never skipped for want of one.
//
// Fuzzing starts no control plane (see Fuzzing): *env stays nil there, so
// fuzz targets must not use it.
func Main(m *testing.M, opts Options, env **Env, setup ...func(ctx context.Context) error) {
	os.Exit(Run(m, opts, env, setup...))
}

// Run is Main without the exit: it returns the exit code once the tests ran
// and the control plane stopped, so that TestMain can check more, e.g. that
// no goroutine outlived the tests:
//
//	func TestMain(m *testing.M) {
//		code := testenv.Run(m, testenv.Options{}, &env)
//		if code == 0 && goleak.Find() != nil { code = 1 }
//		os.Exit(code)
//	}
func Run(m *testing.M, opts Options, env **Env, setup ...func(ctx context.Context) error) int {
	if Fuzzing() {
		return m.Run()
	}
	return run(m, opts, env, setup)
}

// Fuzzing reports whether this test process only fuzzes: a fuzz worker
// (-test.fuzzworker), or the coordinator of `go test -run='^$' -fuzz=X`,
// which runs nothing but the fuzz target. Such processes must not start a
// control plane each (test/fuzz/run.sh runs every target this way). It
// parses the test flags, as TestMain may.
func Fuzzing() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	value := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return value("test.fuzzworker") == "true" || (value("test.fuzz") != "" && value("test.run") == "^$")
}

func run(m *testing.M, opts Options, env **Env, setup []func(ctx context.Context) error) int {
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
	*env = e
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, fn := range setup {
		if err := fn(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: setup: %v\n", err)
			return 1
		}
	}
	return m.Run()
}

// Namespace creates a namespace with a generated name for one test and
// deletes it when the test ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	if err := e.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		// t.Context() is already canceled during cleanup.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Client.Delete(ctx, ns)
	})
	return ns.Name
}
