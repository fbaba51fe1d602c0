package write

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

func TestOptionsWithDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   Options
		want Options
	}{
		{name: "zero means default", in: Options{}, want: Options{QPS: DefaultQPS, Burst: DefaultBurst, Backoff: DefaultBackoff}},
		{name: "negative means default", in: Options{QPS: -1, Burst: -1}, want: Options{QPS: DefaultQPS, Burst: DefaultBurst, Backoff: DefaultBackoff}},
		{name: "set fields kept", in: Options{QPS: 7, Burst: 3, Backoff: wait.Backoff{Steps: 2}}, want: Options{QPS: 7, Burst: 3, Backoff: wait.Backoff{Steps: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.in.WithDefaults(); got != tt.want {
				t.Errorf("WithDefaults() = %+v, want %+v", got, tt.want)
			}
			if got := New(tt.in).Options(); got != tt.want {
				t.Errorf("New().Options() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestBudgetIsShared checks that every user of one Writer draws on one
// budget: with a burst of 2 and a rate far too slow to refill, the third
// write (from another "component") is refused before it runs, because the
// limiter knows its wait would outlast the context.
func TestBudgetIsShared(t *testing.T) {
	w := New(Options{QPS: 1e-6, Burst: 2})
	ran := 0
	write := func(context.Context) error { ran++; return nil }
	for i := range 2 {
		if err := w.Do(t.Context(), write); err != nil {
			t.Fatalf("write %d within the burst: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	if err := w.Do(ctx, write); err == nil {
		t.Fatal("third write beyond the shared burst ran, want a rate limit error")
	}
	if ran != 2 {
		t.Errorf("ran %d writes, want 2", ran)
	}
}

func TestDoRetries(t *testing.T) {
	gr := schema.GroupResource{Resource: "things"}
	tests := []struct {
		name     string
		err      error
		wantRuns int
	}{
		{name: "conflict retried until the attempts run out", err: apierrors.NewConflict(gr, "x", errors.New("changed")), wantRuns: 3},
		{name: "not found not retried", err: apierrors.NewNotFound(gr, "x"), wantRuns: 1},
		{name: "other error not retried", err: errors.New("boom"), wantRuns: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := New(Options{QPS: 1e6, Burst: 1e6, Backoff: wait.Backoff{Duration: time.Microsecond, Factor: 1, Steps: 3}})
			runs := 0
			err := w.Do(t.Context(), func(context.Context) error { runs++; return tt.err })
			if !errors.Is(err, tt.err) && err != tt.err {
				t.Errorf("Do() = %v, want %v", err, tt.err)
			}
			if runs != tt.wantRuns {
				t.Errorf("ran %d times, want %d", runs, tt.wantRuns)
			}
		})
	}
}
