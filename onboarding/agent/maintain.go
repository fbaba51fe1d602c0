package agent

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// maintain keeps the session's tokens fresh until its registration is gone
// (it returns, and Run onboards again) or ctx ends.
func (a *Agent) maintain(ctx context.Context) {
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := make(chan string, 1)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		a.watch(mctx, gone)
	}()
	defer func() { cancel(); <-watchDone }()
	dnsDone := make(chan struct{})
	go func() {
		defer close(dnsDone)
		a.hostDNSWhenReady(mctx)
	}()
	defer func() { cancel(); <-dnsDone }()

	s := a.current()
	tokenNext := a.renewAt(s.tokenIssued, s.tokenExpiry, a.opts.RenewFraction)
	sidecarNext := time.Time{}
	if s.hasSidecarCred {
		sidecarNext = a.renewAt(s.sidecarIssued, s.sidecarExpiry, a.opts.SidecarRenewFraction)
	}
	tokenBackoff, sidecarBackoff := a.backoff(), a.backoff()
	for {
		next := tokenNext
		if !sidecarNext.IsZero() && sidecarNext.Before(next) {
			next = sidecarNext
		}
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case why := <-gone:
			timer.Stop()
			a.log.Info("registration gone; onboarding again", "registration", s.namespace+"/"+s.name, "reason", why)
			return
		case <-timer.C:
		}
		now := time.Now()
		if !tokenNext.After(now) {
			if err := a.renewToken(ctx); err != nil {
				a.logRefusal("onboarding token renewal", err)
				tokenNext = now.Add(tokenBackoff.Step())
			} else {
				tokenBackoff = a.backoff()
				s = a.current()
				tokenNext = a.renewAt(s.tokenIssued, s.tokenExpiry, a.opts.RenewFraction)
			}
		}
		if !sidecarNext.IsZero() && !sidecarNext.After(now) {
			err := a.renewSidecarToken(ctx)
			switch {
			case status.Code(err) == codes.NotFound:
				a.log.Info("registration gone (sidecar token renewal: NotFound); onboarding again", "registration", s.namespace+"/"+s.name)
				return
			case err != nil:
				a.logRefusal("sidecar token renewal", err)
				sidecarNext = now.Add(sidecarBackoff.Step())
			default:
				sidecarBackoff = a.backoff()
				s = a.current()
				sidecarNext = a.renewAt(s.sidecarIssued, s.sidecarExpiry, a.opts.SidecarRenewFraction)
			}
		}
	}
}

// renewAt is when a credential issued at issued and expiring at expiry is
// renewed: after fraction of its lifetime.
func (a *Agent) renewAt(issued, expiry time.Time, fraction float64) time.Time {
	life := expiry.Sub(issued)
	if life <= 0 {
		return issued
	}
	return issued.Add(time.Duration(float64(life) * fraction))
}

// renewToken authorizes again with a fresh platform credential (authorize
// sends the current onboarding token and session key) and keeps the new
// token in the session file.
func (a *Agent) renewToken(ctx context.Context) error {
	auth, err := a.authorize(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.session.token, a.session.tokenExpiry, a.session.tokenIssued = auth.resp.GetToken(), auth.resp.GetExpiresAt().AsTime(), time.Now()
	a.mu.Unlock()
	a.saveSession()
	a.log.Info("onboarding token renewed", "expiresAt", auth.resp.GetExpiresAt().AsTime())
	return nil
}

// renewSidecarToken gets a fresh sidecar token and rewrites its file.
func (a *Agent) renewSidecarToken(ctx context.Context) error {
	s := a.current()
	res, err := a.api.RenewSidecarToken(withSession(withToken(ctx, s.token), s.sessionKey), &onboardingv1alpha1.RenewSidecarTokenRequest{})
	if err != nil {
		return err
	}
	if err := a.files.WriteToken(res.GetSidecarToken()); err != nil {
		return err
	}
	a.mu.Lock()
	a.session.sidecarExpiry, a.session.sidecarIssued = res.GetExpiresAt().AsTime(), time.Now()
	a.mu.Unlock()
	a.log.Info("sidecar token renewed", "expiresAt", res.GetExpiresAt().AsTime())
	a.installRoots(ctx, res.GetRootCertificates())
	return nil
}

// installRoots installs the endpoint's current roots (sent with each
// sidecar token renewal) when they differ from the installed ones: a
// rotated serving CA reaches a running VM this way, without onboarding
// again or a restart of the sidecar. Written at its path (restart commands
// configured) or staged with a roots request for
// onboarding-agent-sidecar.service. A failure is logged and tried again at
// the next renewal; the token renewal stands.
func (a *Agent) installRoots(ctx context.Context, roots []byte) {
	if len(roots) == 0 {
		return
	}
	sc := a.opts.Agent.Sidecar
	var (
		changed bool
		err     error
		how     = "written to " + sc.Bootstrap.RootCert
	)
	if sc.Direct() {
		changed, err = a.files.InstallRoots(roots)
	} else if changed, err = a.files.StageRoots(sc.StagingDir, roots); err == nil && changed {
		how, err = a.sidecarAction(ctx, sidecar.RequestRoots)
	}
	switch {
	case err != nil:
		a.log.Error("cannot install the endpoint's new root certificates; trying again at the next renewal", "error", err.Error())
	case changed:
		a.log.Info("the endpoint's root certificates changed; installed for the sidecar's next connection", "how", how)
	}
}

// watch follows the registration with WatchRegistration and reports on gone
// when it is deleted or replaced. A broken stream is reopened with backoff
// (and the current token).
func (a *Agent) watch(ctx context.Context, gone chan<- string) {
	b := a.backoff()
	for ctx.Err() == nil {
		s := a.current()
		stream, err := a.api.WatchRegistration(withToken(ctx, s.token), &onboardingv1alpha1.WatchRegistrationRequest{})
		for err == nil {
			var ev *onboardingv1alpha1.RegistrationEvent
			if ev, err = stream.Recv(); err != nil {
				break
			}
			b = a.backoff()
			switch {
			case ev.GetState() == onboardingv1alpha1.RegistrationEvent_DELETED:
				gone <- "deleted"
				return
			case s.uid != "" && ev.GetUid() != s.uid:
				gone <- "replaced by registration " + ev.GetUid()
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			a.log.Warn("the endpoint does not serve WatchRegistration; a deleted registration is noticed at the next sidecar token renewal")
			return
		}
		a.log.Info("registration watch interrupted; reconnecting", "error", err.Error())
		if !sleep(ctx, b) {
			return
		}
	}
}

// shutdown unregisters, waits the propagation delay and stops the sidecar.
func (a *Agent) shutdown(ctx context.Context) error {
	s := a.current()
	if s.token != "" {
		uctx, cancel := context.WithTimeout(ctx, a.opts.ShutdownTimeout)
		res, err := a.api.Unregister(withSession(withToken(uctx, s.token), s.sessionKey), &onboardingv1alpha1.UnregisterRequest{})
		cancel()
		if err != nil {
			a.log.Error("unregister failed; the endpoint removes the registration after its grace period", "registration", s.namespace+"/"+s.name, "error", err.Error())
		} else {
			delay := res.GetPropagationDelay().AsDuration()
			a.log.Info("unregistered; waiting the propagation delay before stopping the sidecar", "registration", s.namespace+"/"+s.name, "delay", delay)
			time.Sleep(delay)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, a.opts.ShutdownTimeout)
	defer cancel()
	how, err := a.sidecarAction(sctx, sidecar.RequestStop)
	if err != nil {
		a.log.Error("cannot stop the sidecar", "error", err.Error())
		return err
	}
	a.log.Info("sidecar stopped; onboarding agent exiting", "how", how)
	return nil
}

// hostDNSWhenReady asks onboarding-agent-sidecar.service to point the
// host's resolver at the sidecar's DNS proxy once the proxy has istiod's
// name table (it answers a mesh name with anything but a server failure),
// polling every second until then or until ctx ends. The restart request
// that started this sidecar removed any earlier configuration, so the
// host's resolver never asks a sidecar that has not answered. Only in
// staging mode (the root-run service owns the resolver) and with the DNS
// proxy on.
func (a *Agent) hostDNSWhenReady(ctx context.Context) {
	sc := a.opts.Agent.Sidecar
	if sc.Direct() || !sc.DNS.On() {
		return
	}
	domain := "cluster.local"
	if len(sc.DNS.Domains) > 0 {
		domain = sc.DNS.Domains[0]
	}
	if hostdns.WaitReady(ctx, sc.DNS.Address, "istio-agent-probe."+domain, time.Second) != nil {
		return
	}
	how, err := a.sidecarAction(ctx, sidecar.RequestDNSOn)
	if err != nil {
		a.log.Error("cannot ask for the host resolver's mesh DNS configuration", "error", err.Error())
		return
	}
	a.log.Info("sidecar answers DNS; host resolver asked to send mesh domains to it", "address", sc.DNS.Address,
		"domains", sc.DNS.Domains, "how", how)
}
