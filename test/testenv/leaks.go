package testenv

import (
	"fmt"
	"os"

	"go.uber.org/goleak"
)

// CheckLeaks returns code, or 1 when the tests passed (code 0) but
// goroutines outlived them and the control plane: every stream, watch and
// writer a test started must have ended. Call it from TestMain with Run's
// result:
//
//	os.Exit(testenv.CheckLeaks(testenv.Run(m, opts, &env, setup)))
//
// Process-wide daemons of libraries (klog's flusher, and the like) are
// ignored.
func CheckLeaks(code int, opts ...goleak.Option) int {
	if code != 0 || Fuzzing() {
		return code
	}
	opts = append(opts,
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: goroutines outlived the tests: %v\n", err)
		return 1
	}
	return 0
}
