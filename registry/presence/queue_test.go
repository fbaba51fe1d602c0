package presence

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/embark-mesh/embark/registry/write"
)

// fakeStore is a latest queue's store: it records the states it was given
// and answers from a script (then done).
type fakeStore struct {
	mu      sync.Mutex
	seen    []int
	answers []func() (time.Duration, error)
	block   chan struct{} // when set, the first call waits for it
	ended   int
}

func (f *fakeStore) store(_ *slot[int], s *int) (time.Duration, error) {
	f.mu.Lock()
	f.seen = append(f.seen, *s)
	block := f.block
	f.block = nil
	var answer func() (time.Duration, error)
	if len(f.answers) > 0 {
		answer, f.answers = f.answers[0], f.answers[1:]
	}
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	if answer == nil {
		return 0, nil
	}
	return answer()
}

func (f *fakeStore) got() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

func newFakeQueue(ctx context.Context, f *fakeStore) (*latest[*slot[int], int], *sync.Mutex) {
	mu := &sync.Mutex{}
	return &latest[*slot[int], int]{
		ctx: ctx, mu: mu,
		retry:    wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30},
		store:    f.store,
		retrying: func(*slot[int], *int, error, time.Duration) {},
		ended:    func(*slot[int]) { f.ended++ }, // mu held
	}, mu
}

func put(q *latest[*slot[int], int], mu *sync.Mutex, sl *slot[int], v int) {
	mu.Lock()
	defer mu.Unlock()
	q.putLocked(sl, sl, &v)
}

func TestLatestQueue(t *testing.T) {
	tests := []struct {
		name    string
		answers []func() (time.Duration, error)
		block   bool  // the first store waits until the later states are put
		puts    []int // states put (the first before the writer runs)
		want    []int // states the store was given
	}{
		{
			name: "stores one state once",
			puts: []int{1}, want: []int{1},
		},
		{
			name:  "a newer state replaces the pending ones (coalescing)",
			block: true, puts: []int{1, 2, 3, 4}, want: []int{1, 4},
		},
		{
			name: "retried until stored",
			answers: []func() (time.Duration, error){
				func() (time.Duration, error) { return 0, errors.New("API server unavailable") },
				func() (time.Duration, error) { return 0, errors.New("API server unavailable") },
			},
			puts: []int{1}, want: []int{1, 1, 1},
		},
		{
			name: "a held state is looked at again after the hold",
			answers: []func() (time.Duration, error){
				func() (time.Duration, error) { return 5 * time.Millisecond, nil },
			},
			puts: []int{1}, want: []int{1, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			f := &fakeStore{answers: tt.answers}
			release := make(chan struct{})
			if tt.block {
				f.block = release
			}
			q, mu := newFakeQueue(ctx, f)
			sl := newSlot[int]()
			put(q, mu, &sl, tt.puts[0])
			if tt.block {
				// The writer is in the first store: the later states wait.
				if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
					return len(f.got()) == 1, nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			for _, v := range tt.puts[1:] {
				put(q, mu, &sl, v)
			}
			close(release)
			if err := write.WaitIdle(ctx, "states", q.busy); err != nil {
				t.Fatal(err)
			}
			if got := f.got(); !slices.Equal(got, tt.want) {
				t.Errorf("stored %v, want %v", got, tt.want)
			}
			mu.Lock()
			if sl.pending != nil || sl.running || f.ended != 1 {
				t.Errorf("after the writer ended: pending %v, running %v, ended %d times", sl.pending, sl.running, f.ended)
			}
			mu.Unlock()
			cancel()
			q.wait()
		})
	}
}

// A held state is replaced by a newer one at once (no wait for the hold),
// and the queue's writers end with its context.
func TestLatestQueueHoldEndsOnANewerState(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := &fakeStore{answers: []func() (time.Duration, error){
		func() (time.Duration, error) { return time.Hour, nil },
	}}
	q, mu := newFakeQueue(ctx, f)
	sl := newSlot[int]()
	put(q, mu, &sl, 1)
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(f.got()) == 1, nil
	}); err != nil {
		t.Fatal(err)
	}
	put(q, mu, &sl, 2)
	flush, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := write.WaitIdle(flush, "states", q.busy); err != nil {
		t.Fatalf("the newer state waited for the hour-long hold: %v", err)
	}
	if got := f.got(); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("stored %v, want [1 2]", got)
	}

	// Held forever, then the context ends: the writer ends.
	f.mu.Lock()
	f.answers = []func() (time.Duration, error){func() (time.Duration, error) { return time.Hour, nil }}
	f.mu.Unlock()
	put(q, mu, &sl, 3)
	cancel()
	q.wait()
	if q.busy() != 0 {
		t.Errorf("%d writers busy after the context ended", q.busy())
	}
}
