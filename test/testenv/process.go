package testenv

import (
	"os"
	"time"
)

// Terminate stops a child process the way the test control plane and the
// demo stop theirs: it sends sig, waits up to grace for done (closed or
// sent on when the process's Wait returned), then kills the process and
// waits for done.
func Terminate[T any](p *os.Process, sig os.Signal, done <-chan T, grace time.Duration) {
	_ = p.Signal(sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.Kill()
		<-done
	}
}
