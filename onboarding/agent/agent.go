// Package agent is the onboarding agent's flow: it proves the host's
// platform identity to the onboarding endpoint (Authorize), registers the
// workload (Register), writes the Istio sidecar's bootstrap files and
// restarts the sidecar, keeps the onboarding and sidecar tokens fresh, runs
// the flow again when its registration is deleted (WatchRegistration), and
// on shutdown unregisters, waits the propagation delay and stops the
// sidecar. While onboarding is refused (no WorkloadGroup, no allowing
// OnboardingPolicy, endpoint down) it retries forever with capped, jittered
// backoff, logging the endpoint's message; it never rewrites the sidecar's
// files with anything but a successful registration.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// Options configures an Agent. Every field documents its default.
type Options struct {
	// Agent and Onboarding are the loaded configuration files. Required.
	Agent      *config.AgentConfiguration
	Onboarding *config.OnboardingConfiguration
	// Platform produces the platform credential. Required (platform.Detect).
	Platform platform.Platform
	// Version is reported in the registration. Default "dev".
	Version string
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the jittered exponential backoff of
	// every retry. Defaults 1s and 1m.
	MinBackoff, MaxBackoff time.Duration
	// RenewFraction of a token's lifetime after which it is renewed.
	// Default 0.8.
	RenewFraction float64
	// SidecarRenewFraction is the same for the sidecar token. Default
	// RenewFraction.
	SidecarRenewFraction float64
	// ShutdownTimeout bounds Unregister at shutdown. Default 10s.
	ShutdownTimeout time.Duration
	// DialOptions are added to the connection to the endpoint (tests).
	DialOptions []grpc.DialOption
}

func (o *Options) setDefaults() error {
	if o.Agent == nil || o.Onboarding == nil || o.Platform == nil {
		return errors.New("agent: Agent, Onboarding and Platform are required")
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(time.Minute, o.MinBackoff)
	}
	if o.RenewFraction <= 0 || o.RenewFraction >= 1 {
		o.RenewFraction = 0.8
	}
	if o.SidecarRenewFraction <= 0 || o.SidecarRenewFraction >= 1 {
		o.SidecarRenewFraction = o.RenewFraction
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	return nil
}

// Agent runs the onboarding flow.
type Agent struct {
	opts  Options
	log   *slog.Logger
	api   onboardingv1alpha1.OnboardingServiceClient
	conn  *grpc.ClientConn
	files *sidecar.Files

	mu      sync.Mutex
	session *session
	// requests counts sidecar requests (staging mode).
	requests uint64
	state    state // what the metrics report
}

// state is what the agent's metrics report of the onboarding flow.
type state struct {
	onboarded   bool
	lastError   string // reason of the last failed onboarding attempt; "" once onboarded
	lastErrorAt time.Time
	lastMessage string            // what went wrong at the last failed attempt
	failures    map[string]uint64 // failed onboarding attempts by reason
}

// session is the state of one successful onboarding.
type session struct {
	token          string
	tokenExpiry    time.Time
	tokenIssued    time.Time
	namespace      string
	name           string
	uid            string
	sidecarExpiry  time.Time
	sidecarIssued  time.Time
	hasSidecarCred bool
	// sessionKey binds this agent to its registration and its onboarding
	// tokens: made by the agent when it starts (or kept across restarts,
	// restoreSession) and sent on every Authorize, Register,
	// RenewSidecarToken and Unregister.
	sessionKey string
}

// New returns an Agent; it connects lazily.
func New(opts Options) (*Agent, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	creds, err := transportCredentials(opts.Onboarding, opts.Agent.Sidecar.Bootstrap.RootCert)
	if err != nil {
		return nil, err
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts.DialOptions...)
	conn, err := grpc.NewClient(opts.Onboarding.Address(), dial...)
	if err != nil {
		return nil, fmt.Errorf("connect to the onboarding endpoint %s: %w", opts.Onboarding.Address(), err)
	}
	return &Agent{
		opts:  opts,
		log:   opts.Logger,
		api:   onboardingv1alpha1.NewOnboardingServiceClient(conn),
		conn:  conn,
		files: &sidecar.Files{Paths: opts.Agent.Sidecar.Bootstrap, Env: envOptions(&opts.Agent.Sidecar)},
	}, nil
}

// transportCredentials verifies the endpoint against the system roots, or,
// with onboardingEndpoint.caCertificates, against that file and the roots
// installed from the endpoint (installedRoots), both read again at each
// handshake (endpointTrust).
func transportCredentials(cfg *config.OnboardingConfiguration, installedRoots string) (credentials.TransportCredentials, error) {
	tc := &tls.Config{ServerName: cfg.ServerName(), MinVersion: tls.VersionTLS12}
	if f := cfg.OnboardingEndpoint.CACertificates; f != "" {
		trust, err := newEndpointTrust(f, installedRoots)
		if err != nil {
			return nil, err
		}
		// The chain is verified by VerifyConnection against the roots as
		// they are at this handshake; crypto/tls's own verification, with
		// roots fixed when the configuration is made, is replaced by it.
		tc.InsecureSkipVerify = true //nolint:gosec // VerifyConnection verifies the chain and the server name
		tc.VerifyConnection = trust.verify(cfg.ServerName())
	}
	return credentials.NewTLS(tc), nil
}

// Run runs the flow until ctx ends, then shuts down: Unregister, wait the
// propagation delay, stop the sidecar. It returns nil after a clean
// shutdown.
func (a *Agent) Run(ctx context.Context) error {
	defer func() { _ = a.conn.Close() }()
	a.log.Info("onboarding agent starting", "version", a.opts.Version, "endpoint", a.opts.Onboarding.Address(),
		"workloadGroup", a.workloadGroup(), "platform", a.opts.Platform.Name())
	a.restoreSession()
	for ctx.Err() == nil {
		if err := a.onboard(ctx); err != nil {
			break // ctx ended
		}
		a.maintain(ctx)
		a.setOnboarded(false)
	}
	return a.shutdown(context.WithoutCancel(ctx))
}

// onboard authorizes and registers, retrying until it succeeds or ctx ends,
// then writes the bootstrap and restarts the sidecar.
func (a *Agent) onboard(ctx context.Context) error {
	b := a.backoff()
	for {
		sess, boot, err := a.register(ctx)
		if err == nil {
			if err := a.writeBootstrap(sidecar.Identity{Namespace: sess.namespace, RegistrationName: sess.name}, boot); err != nil {
				a.failed(reasonBootstrapWrite, err.Error())
				a.log.Error("cannot write the sidecar's bootstrap files; retrying", "error", err.Error())
			} else {
				a.setSession(sess)
				a.saveSession()
				a.setOnboarded(true)
				a.log.Info("onboarded: sidecar bootstrap written", "registration", sess.namespace+"/"+sess.name,
					"nodeID", boot.GetNodeId(), "discoveryAddress", boot.GetDiscoveryAddress(), "tokenExpiresAt", sess.tokenExpiry)
				a.restartSidecar(ctx)
				return nil
			}
		} else if ctx.Err() == nil {
			a.failed(failureReason(err), failureMessage(err))
			a.logRefusal("onboarding", err)
		}
		if !sleep(ctx, b) {
			return ctx.Err()
		}
	}
}

// register runs Authorize and Register once.
func (a *Agent) register(ctx context.Context) (*session, *onboardingv1alpha1.SidecarBootstrap, error) {
	auth, err := a.authorize(ctx)
	if err != nil {
		return nil, nil, err
	}
	addrs, err := a.addresses(auth.cred)
	if err != nil {
		return nil, nil, err
	}
	w := a.opts.Onboarding.Workload
	req := &onboardingv1alpha1.RegisterRequest{
		Addresses:           addrs,
		ConnectedOver:       w.ConnectedOver,
		AgentVersion:        a.opts.Version,
		IstioSidecarVersion: a.opts.Agent.Sidecar.Istio.Version,
		Labels:              w.Labels,
		LastError:           a.lastErrorReport(),
	}
	res, err := a.api.Register(withSession(withToken(ctx, auth.resp.GetToken()), a.current().sessionKey), req)
	if err != nil {
		return nil, nil, fmt.Errorf("register: %w", err)
	}
	now := time.Now()
	s := &session{
		token: auth.resp.GetToken(), tokenExpiry: auth.resp.GetExpiresAt().AsTime(), tokenIssued: now,
		namespace: res.GetNamespace(), name: res.GetRegistrationName(), uid: res.GetRegistrationUid(),
		sessionKey: res.GetSessionKey(),
	}
	if boot := res.GetBootstrap(); boot.GetSidecarTokenExpiresAt() != nil {
		s.sidecarExpiry, s.sidecarIssued, s.hasSidecarCred = boot.GetSidecarTokenExpiresAt().AsTime(), now, true
	}
	return s, res.GetBootstrap(), nil
}

type authorized struct {
	resp *onboardingv1alpha1.AuthorizeResponse
	cred *platform.Credential
}

// authorize gets a fresh platform credential and an onboarding token bound
// to the agent's session. The request carries the session key and the
// current onboarding token, if any, as RenewSidecarToken's does: a
// platform whose metadata service hands out the same cached credential
// again (Azure's) has it accepted a second time only as this session's.
func (a *Agent) authorize(ctx context.Context) (*authorized, error) {
	cred, err := a.opts.Platform.Credential(ctx)
	if err != nil {
		return nil, &platformError{err: err}
	}
	w := a.opts.Onboarding.Workload
	req := &onboardingv1alpha1.AuthorizeRequest{WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: w.Namespace, Name: w.Name}}
	cred.SetOn(req)
	s := a.current()
	actx := withSession(ctx, s.sessionKey)
	if s.token != "" {
		actx = withToken(actx, s.token)
	}
	resp, err := a.api.Authorize(actx, req)
	if err != nil {
		return nil, fmt.Errorf("authorize: %w", err)
	}
	return &authorized{resp: resp, cred: cred}, nil
}

// addresses are the configured addresses, else the platform's, else the
// local address towards the endpoint.
func (a *Agent) addresses(cred *platform.Credential) ([]*onboardingv1alpha1.HostAddress, error) {
	var out []*onboardingv1alpha1.HostAddress
	for _, ad := range a.opts.Onboarding.Workload.Addresses {
		out = append(out, &onboardingv1alpha1.HostAddress{Ip: ad.IP, Type: ad.Type})
	}
	if len(out) > 0 {
		return out, nil
	}
	if cred.Address != nil {
		return []*onboardingv1alpha1.HostAddress{{Ip: cred.Address.IP, Type: cred.Address.Type}}, nil
	}
	ip, err := platform.LocalAddress(a.opts.Onboarding.Address())
	if err != nil {
		return nil, fmt.Errorf("no workload.addresses configured and %w", err)
	}
	return []*onboardingv1alpha1.HostAddress{{Ip: ip, Type: "VPC"}}, nil
}

func (a *Agent) setSession(s *session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.session = s
}

func (a *Agent) current() session {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.session == nil {
		return session{}
	}
	return *a.session
}

// writeBootstrap writes the bootstrap at its paths (restart commands
// configured) or stages it for onboarding-agent-sidecar.service.
func (a *Agent) writeBootstrap(id sidecar.Identity, boot *onboardingv1alpha1.SidecarBootstrap) error {
	if a.opts.Agent.Sidecar.Direct() {
		return a.files.Write(id, boot)
	}
	return a.files.Stage(a.opts.Agent.Sidecar.StagingDir, id, boot)
}

// sidecarAction restarts or stops the sidecar: the configured command, or a
// request to onboarding-agent-sidecar.service through the staging
// directory.
func (a *Agent) sidecarAction(ctx context.Context, action sidecar.Action) (string, error) {
	sc := a.opts.Agent.Sidecar
	if sc.Direct() {
		argv := sc.RestartCommand
		if action == sidecar.RequestStop {
			argv = sc.StopCommand
		}
		return strings.Join(argv, " "), sidecar.Run(ctx, argv)
	}
	a.mu.Lock()
	a.requests++
	seq := a.requests
	a.mu.Unlock()
	how := "request " + string(action) + " of " + sc.Unit + " in " + sc.StagingDir
	return how, sidecar.Request(sc.StagingDir, action, seq)
}

// restartSidecar restarts the sidecar, retrying with backoff on failure
// (the bootstrap stays written).
func (a *Agent) restartSidecar(ctx context.Context) {
	b := a.backoff()
	for {
		how, err := a.sidecarAction(ctx, sidecar.RequestRestart)
		if err == nil {
			a.log.Info("sidecar (re)started", "how", how)
			return
		}
		if ctx.Err() != nil {
			return
		}
		a.log.Error("cannot restart the sidecar; retrying", "error", err.Error())
		if !sleep(ctx, b) {
			return
		}
	}
}

// platformError is a failure to get the host's platform credential (IMDS,
// the JWT file or command).
type platformError struct{ err error }

func (e *platformError) Error() string { return "platform credential: " + e.err.Error() }
func (e *platformError) Unwrap() error { return e.err }

// Reasons of a failed onboarding attempt besides the endpoint's gRPC code.
const (
	reasonPlatformCredential = "PlatformCredential"
	reasonBootstrapWrite     = "BootstrapWrite"
)

// failureReason is the reason the metrics report for a failed Authorize
// and Register: PlatformCredential, else the endpoint's gRPC code
// (PermissionDenied, FailedPrecondition, Unavailable, ...).
func failureReason(err error) string {
	if pe := (*platformError)(nil); errors.As(err, &pe) {
		return reasonPlatformCredential
	}
	return status.Code(err).String()
}

// failed records a failed onboarding attempt: its reason and message.
func (a *Agent) failed(reason, message string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state.failures == nil {
		a.state.failures = map[string]uint64{}
	}
	a.state.failures[reason]++
	a.state.lastError, a.state.lastErrorAt, a.state.lastMessage = reason, time.Now(), message
}

// lastErrorReport is the last failed onboarding attempt since the host last
// onboarded, as Register reports it; nil when there was none.
func (a *Agent) lastErrorReport() *onboardingv1alpha1.AgentError {
	a.mu.Lock()
	defer a.mu.Unlock()
	return lastErrorReport(a.state.lastError, a.state.lastMessage)
}

// setOnboarded records whether the host holds a registration; onboarding
// clears the last error.
func (a *Agent) setOnboarded(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state.onboarded = on
	if on {
		a.state.lastError = ""
	}
}

// logRefusal logs why onboarding failed, with the endpoint's message.
func (a *Agent) logRefusal(stage string, err error) {
	// The status of a wrapped gRPC error, or of err itself (FromError of
	// nil would be an OK status).
	st, ok := status.FromError(errors.Unwrap(err))
	if !ok || errors.Unwrap(err) == nil {
		st, ok = status.FromError(err)
	}
	if !ok {
		a.log.Warn(stage+" failed; retrying", "error", err.Error())
		return
	}
	hint := ""
	switch st.Code() {
	case codes.FailedPrecondition:
		hint = "create the WorkloadGroup (and its service account) named in the onboarding configuration"
	case codes.PermissionDenied:
		hint = "an OnboardingPolicy in the WorkloadGroup's namespace must allow this workload"
	case codes.InvalidArgument:
		hint = "the endpoint refuses what this agent reports: check workload.labels and workload.addresses of the onboarding configuration"
	case codes.Unauthenticated:
		hint = "the endpoint does not accept this host's platform credential"
	case codes.Unavailable, codes.DeadlineExceeded:
		hint = "the onboarding endpoint, or AWS STS, which it verifies the credential with, is not reachable"
	}
	a.log.Warn(stage+" refused; retrying", "code", st.Code().String(), "message", st.Message(), "hint", hint)
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// withSession adds the session key of the agent's registration, if any.
func withSession(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "embark-session-key", key)
}

// backoff is capped, jittered exponential backoff: each delay is uniformly
// in [d/2, d), d doubling from MinBackoff up to MaxBackoff (apimachinery's
// jitter adds up to one more base duration to a base of d/2).
func (a *Agent) backoff() *wait.Backoff {
	return &wait.Backoff{Duration: a.opts.MinBackoff / 2, Factor: 2, Jitter: 1, Steps: math.MaxInt32, Cap: a.opts.MaxBackoff / 2}
}

// sleep waits b's next delay; false when ctx ended first.
func sleep(ctx context.Context, b *wait.Backoff) bool {
	t := time.NewTimer(b.Step())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// envOptions are the cluster.env settings of the agent's sidecar
// configuration.
func envOptions(sc *config.Sidecar) sidecar.EnvOptions {
	env := sidecar.EnvOptions{Revision: sc.Istio.Revision, CAAddress: sc.CAAddress}
	if sc.DNS.On() {
		env.DNSAddress, env.DNSAutoAllocate = sc.DNS.Address, sc.DNS.AutoAllocate
	}
	return env
}
