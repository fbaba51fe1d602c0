package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/embark-mesh/embark/test/vmsim"
)

// demoTB lets the demo reuse test/istioagent, whose helpers take a
// testing.TB, outside a test. Only the methods those helpers call are
// implemented; the embedded nil testing.TB supplies the unexported method
// the interface requires (calling any other method panics, which would be a
// bug in the demo).
//
// Fatalf panics with a fatal value that runStep turns into the step's
// error; Errorf records an error that Err returns; cleanups run in reverse
// order on Close, as in a test.
type demoTB struct {
	testing.TB
	ctx  context.Context
	log  io.Writer
	temp string

	mu       sync.Mutex
	errs     []string
	cleanups []func()
	temps    int
}

// fatal is the panic value of demoTB.Fatalf: vmsim's, so that a sidecar
// unit command fails with it rather than the demo.
type fatal = vmsim.Fatal

func newDemoTB(ctx context.Context, log io.Writer, tempDir string) *demoTB {
	return &demoTB{ctx: ctx, log: log, temp: tempDir}
}

func (t *demoTB) Helper()                  {}
func (t *demoTB) Context() context.Context { return t.ctx }
func (t *demoTB) Name() string             { return "embark-demo" }

func (t *demoTB) Logf(format string, args ...any) { fmt.Fprintf(t.log, format+"\n", args...) }

func (t *demoTB) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.mu.Lock()
	t.errs = append(t.errs, msg)
	t.mu.Unlock()
	t.Logf("%s", msg)
}

func (t *demoTB) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.Logf("%s", msg)
	panic(fatal(msg))
}

func (t *demoTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.errs) > 0
}

func (t *demoTB) Cleanup(fn func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, fn)
}

func (t *demoTB) TempDir() string {
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
func (t *demoTB) Close() {
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
func (t *demoTB) Errs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.errs...)
}
