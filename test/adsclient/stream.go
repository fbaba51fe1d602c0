package adsclient

import (
	"context"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// request is a SotW or Delta request: what stream needs of it.
type request interface {
	GetNode() *core.Node
}

// stream holds what SotW and Delta share: sending with the node on the
// first request, receiving with a deadline, waiting for the end, closing.
type stream[Req request, Resp any] struct {
	send    func(Req) error
	setNode func(Req, *core.Node)
	cancel  context.CancelFunc
	node    *core.Node // sent with the first request, then nil
	recv    receiver[Resp]
}

// Send sends req as it is, adding the node when it is the stream's first
// request and req has none.
func (s *stream[Req, Resp]) Send(req Req) error {
	if s.node != nil && req.GetNode() == nil {
		s.setNode(req, s.node)
	}
	s.node = nil
	return s.send(req)
}

// Recv returns the next response, or an error wrapping ErrTimeout after
// timeout (DefaultTimeout when zero).
func (s *stream[Req, Resp]) Recv(timeout time.Duration) (Resp, error) {
	return s.recv.next(timeout)
}

// Next returns the next response, waiting as long as the stream lives: for
// a reader that runs beside the test.
func (s *stream[Req, Resp]) Next() (Resp, error) {
	return s.recv.next(-1)
}

// Wait receives until the stream ends and returns why (never nil: io.EOF
// when the server closed it cleanly).
func (s *stream[Req, Resp]) Wait() error {
	return s.recv.drain()
}

// Close cancels the stream, as a sidecar's stream ends when its connection
// goes: the server sees the cancellation, not a half-close.
func (s *stream[Req, Resp]) Close() { s.cancel() }
