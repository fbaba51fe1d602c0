// Package step runs the demo's numbered steps: each prints what a user
// would see and checks it; the first failure stops the run and is named
// with its number and reason (Error). TB lets a step use test helpers that
// take a testing.TB (test/istioagent's) outside a test: their fatal
// errors fail the step, not the demo.
package step

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Step is one numbered step of the demo: what it does, and a function that
// does it, writes what a user would see to out, and checks it.
type Step struct {
	Title string
	Run   func(ctx context.Context, out io.Writer) error
}

// Error is a failed step: its number, title and why.
type Error struct {
	N, Total int
	Title    string
	Err      error
}

func (e *Error) Error() string {
	return fmt.Sprintf("step %d/%d (%s): %v", e.N, e.Total, e.Title, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Run runs steps in order, printing "[n/total] title ... ok (1.2s)"
// followed by the step's output, indented. It stops at the first failure
// and returns it as an *Error.
func Run(ctx context.Context, w io.Writer, steps []Step) error {
	for i, s := range steps {
		fmt.Fprintf(w, "[%d/%d] %s ... ", i+1, len(steps), s.Title)
		if f, ok := w.(interface{ Sync() error }); ok {
			_ = f.Sync()
		}
		var out bytes.Buffer
		start := time.Now()
		err := runStep(ctx, s, &out)
		took := time.Since(start).Round(100 * time.Millisecond)
		if err != nil {
			fmt.Fprintf(w, "FAILED (%s)\n%s", took, Indent(out.String()))
			return &Error{N: i + 1, Total: len(steps), Title: s.Title, Err: err}
		}
		fmt.Fprintf(w, "ok (%s)\n%s", took, Indent(out.String()))
	}
	return nil
}

// runStep runs one step, turning a fatal error from the test helpers the
// demo reuses (see TB) into the step's error.
func runStep(ctx context.Context, s Step, out io.Writer) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = errors.New(string(f))
		}
	}()
	return s.Run(ctx, out)
}

// Indent indents every line of s by four spaces.
func Indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
