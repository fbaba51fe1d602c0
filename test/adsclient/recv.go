package adsclient

import (
	"errors"
	"fmt"
	"time"
)

// ErrTimeout is returned by Recv when nothing arrived before the deadline.
var ErrTimeout = errors.New("no response before the deadline")

// DefaultTimeout is how long Recv waits when given a zero timeout.
const DefaultTimeout = 20 * time.Second

// receiver receives messages of type T with a deadline. A receive that
// timed out stays pending: the next call waits for the same message, so
// none is lost.
type receiver[T any] struct {
	recv    func() (T, error)
	pending chan received[T]
}

type received[T any] struct {
	msg T
	err error
}

// next returns the next message, or ErrTimeout after timeout; a zero
// timeout is DefaultTimeout, a negative one no deadline.
func (r *receiver[T]) next(timeout time.Duration) (T, error) {
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if r.pending == nil {
		ch := make(chan received[T], 1)
		go func() { m, err := r.recv(); ch <- received[T]{m, err} }()
		r.pending = ch
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		deadline = timer.C
	}
	select {
	case got := <-r.pending:
		r.pending = nil
		return got.msg, got.err
	case <-deadline:
		var zero T
		return zero, fmt.Errorf("after %s: %w", timeout, ErrTimeout)
	}
}

// drain receives until the stream ends, first the pending receive if there
// is one, and returns why.
func (r *receiver[T]) drain() error {
	if r.pending != nil {
		got := <-r.pending
		r.pending = nil
		if got.err != nil {
			return got.err
		}
	}
	for {
		if _, err := r.recv(); err != nil {
			return err
		}
	}
}
