package step

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// A failed step stops the run, is named with its number and reason, and its
// output is still shown; a fatal error of the reused test helpers fails the
// step instead of the process.
func TestRunStepsNamesTheFailedStep(t *testing.T) {
	ran := 0
	steps := []Step{
		{"first", func(_ context.Context, out io.Writer) error {
			ran++
			_, err := io.WriteString(out, "shown\n")
			return err
		}},
		{"second", func(_ context.Context, out io.Writer) error {
			ran++
			_, _ = io.WriteString(out, "partial output\n")
			NewTB(context.Background(), io.Discard, t.TempDir()).Fatalf("pilot-agent exited: %s", "exit status 1")
			return nil
		}},
		{"third", func(context.Context, io.Writer) error { ran++; return nil }},
	}
	var b strings.Builder
	err := Run(context.Background(), &b, steps)
	var se *Error
	if !errors.As(err, &se) || se.N != 2 || se.Total != 3 || se.Title != "second" {
		t.Fatalf("error %v, want step 2/3 (second)", err)
	}
	if ran != 2 {
		t.Errorf("%d steps ran, want 2", ran)
	}
	for _, want := range []string{"[1/3] first ... ok (", "    shown\n", "[2/3] second ... FAILED (", "    partial output\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	if !strings.Contains(err.Error(), "step 2/3 (second): pilot-agent exited: exit status 1") {
		t.Errorf("error %q does not say which step and why", err)
	}
}
