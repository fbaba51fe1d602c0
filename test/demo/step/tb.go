package step

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/embark-mesh/embark/test/vmsim"
)

// TB lets the demo reuse test/istioagent, whose helpers take a
// testing.TB, outside a test. Only the methods those helpers call are
// implemented; the embedded nil testing.TB supplies the unexported method
// the interface requires (calling any other method panics, which would be a
// bug in the demo).
//
// Fatalf panics with a fatal value that runStep turns into the step's
// error; Errorf records an error that Errs returns; cleanups run in reverse
// order on Close, as in a test.
type TB struct {
	testing.TB
	ctx  context.Context
	log  io.Writer
	temp string

	mu       sync.Mutex
	errs     []string
	cleanups []func()
	temps    int
}

// fatal is the panic value of TB.Fatalf: vmsim's, so that a sidecar
// unit command fails with it rather than the demo.
type fatal = vmsim.Fatal

// NewTB returns a TB that logs to log and makes its temporary directories
// in tempDir.
func NewTB(ctx context.Context, log io.Writer, tempDir string) *TB {
	return &TB{ctx: ctx, log: log, temp: tempDir}
}

// Helper implements the helpers' TB; it does nothing.
func (t *TB) Helper() {}

// Context is the demo's context.
func (t *TB) Context() context.Context { return t.ctx }

// Name is the demo's name.
func (t *TB) Name() string { return "embark-demo" }

// Logf writes a line to the demo's log.
func (t *TB) Logf(format string, args ...any) { fmt.Fprintf(t.log, format+"\n", args...) }

// Errorf logs the failure and records it for Errs; the step goes on.
func (t *TB) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.mu.Lock()
	t.errs = append(t.errs, msg)
	t.mu.Unlock()
	t.Logf("%s", msg)
}

// Fatalf logs the failure and ends the step: it panics with a value that
// runStep turns into the step's error.
func (t *TB) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.Logf("%s", msg)
	panic(fatal(msg))
}

// Failed reports whether Errorf was called.
func (t *TB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.errs) > 0
}

// Cleanup registers fn to run at Close, last registered first.
func (t *TB) Cleanup(fn func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, fn)
}

// TempDir returns a new directory under the demo's temporary directory.
func (t *TB) TempDir() string {
	t.mu.Lock()
	t.temps++
	n := t.temps
	t.mu.Unlock()
	dir, err := os.MkdirTemp(t.temp, fmt.Sprintf("tmp%d-", n))
	if err != nil {
		t.Fatalf("create temporary directory: %v", err)
	}
	return dir
}

// Close runs the cleanups, last registered first.
func (t *TB) Close() {
	for {
		t.mu.Lock()
		if len(t.cleanups) == 0 {
			t.mu.Unlock()
			return
		}
		fn := t.cleanups[len(t.cleanups)-1]
		t.cleanups = t.cleanups[:len(t.cleanups)-1]
		t.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Logf("cleanup: %v", r)
				}
			}()
			fn()
		}()
	}
}

// Errs returns the errors recorded by Errorf.
func (t *TB) Errs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.errs...)
}
