package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// step is one numbered step of the demo: what it does, and a function that
// does it, writes what a user would see to out, and checks it.
type step struct {
	title string
	run   func(ctx context.Context, out io.Writer) error
}

// stepError is a failed step: its number, title and why.
type stepError struct {
	n, total int
	title    string
	err      error
}

func (e *stepError) Error() string {
	return fmt.Sprintf("step %d/%d (%s): %v", e.n, e.total, e.title, e.err)
}

func (e *stepError) Unwrap() error { return e.err }

// runSteps runs steps in order, printing "[n/total] title ... ok (1.2s)"
// followed by the step's output, indented. It stops at the first failure
// and returns it as a *stepError.
func runSteps(ctx context.Context, w io.Writer, steps []step) error {
	for i, s := range steps {
		fmt.Fprintf(w, "[%d/%d] %s ... ", i+1, len(steps), s.title)
		if f, ok := w.(interface{ Sync() error }); ok {
			_ = f.Sync()
		}
		var out bytes.Buffer
		start := time.Now()
		err := runStep(ctx, s, &out)
		took := time.Since(start).Round(100 * time.Millisecond)
		if err != nil {
			fmt.Fprintf(w, "FAILED (%s)\n%s", took, indent(out.String()))
			return &stepError{n: i + 1, total: len(steps), title: s.title, err: err}
		}
		fmt.Fprintf(w, "ok (%s)\n%s", took, indent(out.String()))
	}
	return nil
}

// runStep runs one step, turning a fatal error from the test helpers the
// demo reuses (see demoTB) into the step's error.
func runStep(ctx context.Context, s step, out io.Writer) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = errors.New(string(f))
		}
	}()
	return s.run(ctx, out)
}

// indent indents every line of s by four spaces.
func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
