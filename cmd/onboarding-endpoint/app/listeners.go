package app

import (
	"fmt"
	"net"
)

// listeners is the endpoint's group of listeners: opened together before
// serving and closed together when anything fails, so that a failed start
// leaves no port bound.
type listeners struct {
	onboarding, metrics, xds net.Listener
	debug                    net.Listener // nil when the xDS debug listener is off
	repository               net.Listener // nil without localRepository

	all []net.Listener
}

// listen opens addr for what (the configuration field named in errors).
func (ls *listeners) listen(addr, what string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (%s): %w", addr, what, err)
	}
	ls.all = append(ls.all, l)
	return l, nil
}

// close closes every listener of the group; closing one a server already
// closed is harmless.
func (ls *listeners) close() {
	for _, l := range ls.all {
		_ = l.Close()
	}
}

// listen is the phase that opens the endpoint's listeners as one group: on
// any error, those already open are closed.
func (b *build) listen() (*listeners, error) {
	ls := &listeners{}
	for _, l := range []struct {
		to         *net.Listener
		addr, what string
		on         bool
	}{
		{&ls.onboarding, b.cfg.Listen.Onboarding, "listen.onboarding", true},
		{&ls.metrics, b.cfg.Listen.Metrics, "listen.metrics", true},
		{&ls.xds, b.cfg.Listen.XDS, "listen.xds", true},
		{&ls.debug, b.opts.DebugXDS, "xDS debug", b.opts.DebugXDS != "off"},
		{&ls.repository, b.cfg.Listen.Repository, "listen.repository", b.cfg.LocalRepository != nil},
	} {
		if !l.on {
			continue
		}
		var err error
		if *l.to, err = ls.listen(l.addr, l.what); err != nil {
			ls.close()
			return nil, err
		}
	}
	return ls, nil
}
