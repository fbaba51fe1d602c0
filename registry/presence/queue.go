package presence

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// latest is the "latest state, retried until stored" queue that Connections
// and HealthMirror share: for each workload (an entry E of its owner) one
// pending state S, which a newer state replaces (coalescing), and one
// goroutine of the workload's own that stores it, retrying with backoff
// until it is stored, dropped, superseded by a newer state, or ctx ends.
// put never blocks on the API server.
//
// The owner's lock (mu) guards every slot and the queue's counters; the
// owner keeps its entries (and their slots) in a map of its own and decides
// in ended, called with mu held when a workload's writer ends, whether to
// forget the entry.
type latest[E, S any] struct {
	ctx   context.Context
	mu    *sync.Mutex
	retry wait.Backoff
	// store stores s once: (0, nil) when it is done (stored, or dropped for
	// good); hold > 0 to look again after hold (or when a newer state comes
	// or the slot is woken); an error to try again after the retry backoff.
	// Called without mu.
	store func(e E, s *S) (hold time.Duration, err error)
	// retrying is told of an error store will be retried after (logs,
	// metrics). Called without mu.
	retrying func(e E, s *S, err error, in time.Duration)
	// ended is called with mu held when e's writer ends (no state left, or
	// ctx ended).
	ended func(e E)

	active int // running writers (mu)
	wg     sync.WaitGroup
}

// slot is one workload's place in a latest queue; the owner's entry holds
// it. Its fields are guarded by the owner's lock.
type slot[S any] struct {
	pending *S // the latest state, not stored yet
	running bool
	wake    chan struct{}
}

func newSlot[S any]() slot[S] { return slot[S]{wake: make(chan struct{}, 1)} }

// signal ends the wait of sl's writer early (a held or retried state is
// looked at again at once).
func (sl *slot[S]) signal() {
	select {
	case sl.wake <- struct{}{}:
	default:
	}
}

// putLocked makes s sl's pending state, replacing an older one, and starts
// the writer of e unless it runs (then it is woken). mu must be held.
func (q *latest[E, S]) putLocked(e E, sl *slot[S], s *S) {
	sl.pending = s
	if sl.running {
		sl.signal()
		return
	}
	if q.ctx.Err() != nil {
		return
	}
	sl.running = true
	q.active++
	q.wg.Add(1)
	go q.run(e, sl)
}

// busy returns the number of running writers.
func (q *latest[E, S]) busy() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.active
}

// wait waits for every writer to end; call it after ctx ended.
func (q *latest[E, S]) wait() { q.wg.Wait() }

// run stores sl's pending states until none is left.
func (q *latest[E, S]) run(e E, sl *slot[S]) {
	defer q.wg.Done()
	var last *S
	var b wait.Backoff
	for {
		q.mu.Lock()
		s := sl.pending
		if s == nil || q.ctx.Err() != nil {
			sl.running = false
			q.active--
			q.ended(e)
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		if s != last {
			last, b = s, q.retry // each state has its own backoff
		}
		hold, err := q.store(e, s)
		if err == nil && hold <= 0 {
			q.mu.Lock()
			if sl.pending == s {
				sl.pending = nil
			}
			q.mu.Unlock()
			continue
		}
		if err != nil {
			hold = b.Step()
			q.retrying(e, s, err, hold)
		}
		q.sleep(sl, hold)
	}
}

// sleep waits d, or until sl is woken (a newer state) or ctx ends.
func (q *latest[E, S]) sleep(sl *slot[S], d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-q.ctx.Done():
	case <-sl.wake:
	case <-t.C:
	}
}
