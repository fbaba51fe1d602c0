package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/api/scheme"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/servingcert"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	"github.com/embark-mesh/embark/onboarding/identity/replay/kubestore"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/onboarding/policystatus"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/enforcement"
	"github.com/embark-mesh/embark/registry/lifecycle"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/registry/rollout"
	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/version"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/configsource"
	"github.com/embark-mesh/embark/xds/revision"
)

// build is the endpoint under construction: each phase method fills in
// its part from the earlier ones' and registers, with defer, how to undo
// what it started; undo runs those in reverse order.
type build struct {
	opts    Options
	cfg     *config.Configuration
	log     *slog.Logger
	restCfg *rest.Config
	writer  *write.Writer // the replica's one write budget
	undos   []func()

	// kubernetes
	sch       *runtime.Scheme
	cs        kubernetes.Interface
	informers cache.Cache
	kc        client.Client // reads from the informer cache
	apiReader client.Client // reads from the API server

	// observability
	recorder record.EventRecorder
	reg      *prometheus.Registry
	metrics  *endpoint.Metrics

	// onboarding
	keys   *token.SecretKeySource
	server *endpoint.Server

	// registry
	conns        *presence.Connections
	stopTracker  context.CancelFunc
	lifecycle    *lifecycle.Lifecycle
	lifecycleErr chan error
	// stopLifecycle ends the lifecycle, which then releases the replica's
	// Lease; lifecycleDone is closed once it has.
	stopLifecycle context.CancelFunc
	lifecycleDone chan struct{}
	healthMirror  *presence.HealthMirror

	// xds
	istiodConn    *grpc.ClientConn
	revisionConns map[string]*grpc.ClientConn // istiod.revisions
	revisions     *revision.Selector          // nil without istiod.revisions
	configSource  *configsource.Source
	enforcement   *enforcement.ConditionWriter
	xdsServer     *xds.Server
	// stopStreams ends the context of every xDS stream.
	stopStreams context.CancelFunc
	lim         *limiters

	// tls
	servingTLS *tls.Config // nil when plaintext
}

// newBuild is the configuration phase: the configuration file, the REST
// configuration, the defaults of the command line.
func newBuild(opts Options) (*build, error) {
	b := &build{opts: opts, log: opts.Logger}
	if b.log == nil {
		b.log = slog.Default()
	}
	var err error
	if b.cfg, err = config.Load(opts.ConfigFile); err != nil {
		return nil, err
	}
	if b.opts.Replica == "" {
		b.opts.Replica, _ = os.Hostname()
	}
	if b.restCfg, err = restConfig(opts.Kubeconfig); err != nil {
		return nil, err
	}
	b.writer = newWriter(b.cfg)
	if b.restCfg.QPS == 0 {
		b.restCfg.QPS, b.restCfg.Burst = clientRateLimit(b.writer.Options())
	}
	if b.opts.DebugXDS == "" {
		b.opts.DebugXDS = DefaultDebugXDS
	}
	if b.opts.DebugXDS != "off" {
		if err := xds.CheckLoopback(b.opts.DebugXDS); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// defer registers f to run when the endpoint stops (or a later phase fails).
func (b *build) deferUndo(f func()) { b.undos = append(b.undos, f) }

// undo runs what the phases registered, last first.
func (b *build) undo() {
	for i := len(b.undos) - 1; i >= 0; i-- {
		b.undos[i]()
	}
	b.undos = nil
}

// requestsPerWrite is how many API requests one write of the budget may
// take: every write is read first (Get, then Update), and the health mirror
// reads the registration once more before writing.
const requestsPerWrite = 3

// clientRateLimit is the client-side rate limit (QPS and burst, per
// client and resource, as client-go applies it) that never throttles below
// the write budget: client-go's default (5 QPS, burst 10) would, and the
// soak (test/soak) showed connection bookkeeping falling minutes behind at 2
// onboardings/s under it. The budget, not this limit, bounds the replica's
// writes; the API server's Priority and Fairness protects the server.
func clientRateLimit(budget write.Options) (float32, int) {
	return float32(requestsPerWrite * budget.QPS), requestsPerWrite * budget.Burst
}

// newWriter builds the replica's one write budget (registration.writeQPS and
// writeBurst; zero: write.DefaultQPS and write.DefaultBurst), shared by every
// component that writes registrations, WorkloadEntries and Secrets.
func newWriter(cfg *config.Configuration) *write.Writer {
	return write.New(write.Options{QPS: cfg.Registration.WriteQPS, Burst: cfg.Registration.WriteBurst})
}

// kubernetes is the phase of the Kubernetes clients and the informer cache,
// synced for every informer a request reads. The pprof listener, when
// asked for, starts here, first, to profile the start-up too.
func (b *build) kubernetes(ctx context.Context) error {
	var err error
	if b.sch, err = scheme.New(); err != nil {
		return err
	}
	if b.cs, err = kubernetes.NewForConfig(b.restCfg); err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	if b.opts.Pprof != "" {
		_, stopPprof, err := startPprof(b.opts.Pprof, b.log)
		if err != nil {
			return err
		}
		b.deferUndo(stopPprof)
	}
	if b.informers, err = cache.New(b.restCfg, cacheOptions(b.cfg, b.sch)); err != nil {
		return fmt.Errorf("informer cache: %w", err)
	}
	if err := registry.SetupIndexes(ctx, b.informers); err != nil {
		return err
	}
	if b.kc, err = client.New(b.restCfg, client.Options{Scheme: b.sch, Cache: &client.CacheOptions{Reader: b.informers}}); err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	if b.apiReader, err = client.New(b.restCfg, client.Options{Scheme: b.sch}); err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	go func() {
		if err := b.informers.Start(ctx); err != nil {
			b.log.Error("informer cache stopped", "error", err)
		}
	}()
	if !b.informers.WaitForCacheSync(ctx) {
		return fmt.Errorf("informer cache did not start: %w", context.Cause(ctx))
	}
	// Every informer a request reads is synced here, before the endpoint is
	// ready: a missing permission then holds start-up (and the reflector logs
	// "forbidden") instead of hanging the first request that needs it.
	for _, l := range []client.ObjectList{&istionetworkingv1.WorkloadGroupList{}, &istionetworkingv1.WorkloadEntryList{}, &authorizationv1alpha1.OnboardingPolicyList{},
		&runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.SecretList{}, &corev1.ServiceAccountList{}} {
		if err := b.informers.List(ctx, l); err != nil { // starts the informer and waits for its sync
			return fmt.Errorf("sync informer for %T: %w", l, err)
		}
	}
	return nil
}

// observability is the phase of the event recorder and the metrics
// registry every later part registers with.
func (b *build) observability(ctx context.Context) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: b.opts.EventCacheSize}))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: b.cs.CoreV1().Events("")})
	b.recorder = broadcaster.NewRecorder(b.sch, corev1.EventSource{Component: "onboarding-endpoint", Host: b.opts.Replica})

	b.reg = prometheus.NewRegistry()
	// go_gc_heap_live_bytes (the heap the last collection kept) besides the
	// default Go metrics: what the soak checks for leaks.
	b.reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := version.Register(b.reg); err != nil {
		return err
	}
	var err error
	if b.metrics, err = endpoint.NewMetrics(b.reg); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// onboarding is the phase of the onboarding API: the token issuer and its
// keys, the identity verifiers, the policy authorizer and its status
// writer, the registrar, and the endpoint server on top of them.
func (b *build) onboarding(ctx context.Context) error {
	cfg, log := b.cfg, b.log
	// Onboarding token keys: created on first start, shared by replicas.
	if _, err := token.EnsureKeySecret(ctx, b.cs.CoreV1(), cfg.Namespace, cfg.TokenIssuer.JWT.SigningKeySecret); err != nil {
		return fmt.Errorf("onboarding token signing key: %w", err)
	}
	b.keys = token.NewSecretKeySource(b.cs.CoreV1(), cfg.Namespace, cfg.TokenIssuer.JWT.SigningKeySecret, token.WithSourceLogger(log))
	go func() {
		if err := b.keys.Start(ctx); err != nil && ctx.Err() == nil {
			log.Error("onboarding token key watch stopped", "error", err)
		}
	}()
	if err := b.keys.WaitForKeys(ctx); err != nil {
		return fmt.Errorf("onboarding token signing key: %w", err)
	}
	tokens, err := token.NewIssuer(b.keys, "https://"+cfg.Audience(), cfg.Audience(),
		token.WithLifetime(cfg.TokenIssuer.JWT.Expiration.Duration), token.WithLogger(log))
	if err != nil {
		return fmt.Errorf("onboarding token issuer: %w", err)
	}

	// Used single-use credentials, recorded for every replica (Leases in
	// the endpoint's namespace), expired ones deleted by each replica.
	used, err := kubestore.New(kubestore.Options{Leases: b.cs.CoordinationV1(), Namespace: cfg.Namespace,
		Replica: b.opts.Replica, Writer: b.writer, Logger: log})
	if err != nil {
		return err
	}
	collectCtx, stopCollect := context.WithCancel(ctx)
	collectDone := make(chan struct{})
	go func() { defer close(collectDone); used.Run(collectCtx) }()
	b.deferUndo(func() { stopCollect(); <-collectDone })
	awsVerifier, err := newAWSVerifier(cfg, log, used)
	if err != nil {
		return err
	}
	var profiles endpoint.InstanceProfileChecker // nil interface when not configured
	if pc, err := newProfileChecker(ctx, cfg, log); err != nil {
		return err
	} else if pc != nil {
		profiles = pc
	}
	var jwtVerifier endpoint.JWTVerifier
	if len(cfg.Identity.JWT) > 0 {
		if jwtVerifier, err = newJWTVerifier(cfg, log, used); err != nil {
			return err
		}
	}
	var gceVerifier endpoint.GCEVerifier
	if cfg.Identity.GCE != nil {
		if gceVerifier, err = newGCEVerifier(ctx, cfg.Identity.GCE, log, used); err != nil {
			return err
		}
	}
	var azureVerifier endpoint.AzureVerifier
	if cfg.Identity.Azure != nil {
		if azureVerifier, err = newAzureVerifier(cfg.Identity.Azure, log, used); err != nil {
			return err
		}
	}
	var ecsVerifier endpoint.ECSVerifier
	if cfg.Identity.ECS != nil {
		if ecsVerifier, err = newECSVerifier(ctx, cfg.Identity.ECS, awsVerifier, log); err != nil {
			return err
		}
	}
	// OnboardingPolicy status: selected WorkloadGroups and this replica's
	// decisions, written when they change.
	decisions := policystatus.NewDecisions()
	authz, err := policy.NewAuthorizer(b.informers, b.recorder, policy.WithLogger(log), policy.WithDecisionRecorder(decisions))
	if err != nil {
		return err
	}
	// Keep each namespace's policy index between requests, rebuilt when a
	// policy changes.
	if err := authz.WatchPolicies(ctx, b.informers); err != nil {
		return err
	}
	policyStatus, err := policystatus.New(policystatus.Options{Client: b.kc, Cache: b.informers, Decisions: decisions, Logger: log})
	if err != nil {
		return err
	}
	if err := triggerOn(ctx, b.informers, policyStatus.Trigger, &authorizationv1alpha1.OnboardingPolicy{}, &istionetworkingv1.WorkloadGroup{}); err != nil {
		return err
	}
	statusCtx, stopStatus := context.WithCancel(ctx)
	statusDone := make(chan struct{})
	go func() { defer close(statusDone); _ = policyStatus.Run(statusCtx) }()
	b.deferUndo(func() { stopStatus(); <-statusDone })
	if b.revisions, err = newRevisions(ctx, b); err != nil {
		return err
	}
	regOpts := registry.Options{
		Client: b.kc, Cache: b.informers, Recorder: b.recorder, Logger: log, Writer: b.writer,
		Revision: cfg.Istiod.Revision, Topology: topology(cfg.Mesh.Network),
		// Every sidecar token issued here is known valid to this
		// replica's xDS server: the sidecar's first stream and certificate
		// request need no TokenReview. b.xdsServer is set below, before
		// anything is served.
		Sidecar: registry.SidecarCredentialOptions{Issued: func(token string, audiences []string) {
			if b.xdsServer != nil {
				b.xdsServer.TokenIssued(token, audiences)
			}
		}},
	}
	if b.revisions != nil {
		regOpts.RevisionOf = b.revisions.OfGroup
	}
	registrar, err := registry.NewRegistrar(regOpts)
	if err != nil {
		return err
	}
	if f := cfg.Mesh.RootCertFile; f != "" {
		if _, err := endpoint.ReadRootCertificates(f); err != nil {
			return fmt.Errorf("mesh.rootCertFile: %w", err)
		}
	}
	if cfg.Registration.AllowLoopbackAddresses {
		log.Warn("accepting loopback workload addresses (registration.allowLoopbackAddresses): for demos and tests only")
	}
	b.server, err = endpoint.NewServer(endpoint.Options{
		AWS: awsVerifier, JWT: jwtVerifier, GCE: gceVerifier, Azure: azureVerifier, ECS: ecsVerifier, Authorizer: authz, Tokens: tokens, Registrar: registrar, Client: b.kc,
		Bootstrap: endpoint.BootstrapSettings{
			DiscoveryAddress: cfg.Mesh.DiscoveryAddress, ClusterID: cfg.Mesh.ClusterID, TrustDomain: cfg.Mesh.TrustDomain,
			RootCertFile: cfg.Mesh.RootCertFile,
		},
		PropagationDelay:       cfg.Registration.PropagationDelay.Duration,
		Logger:                 log,
		Metrics:                b.metrics,
		Recorder:               b.recorder,
		ServiceCIDRs:           config.Prefixes(cfg.Registration.ServiceCIDRs),
		Source:                 sourceCheck(cfg.Registration.SourceAddressCheck),
		AllowLoopbackAddresses: cfg.Registration.AllowLoopbackAddresses,
		VerifyLimit:            endpoint.RateLimit{PerSecond: cfg.Registration.VerifyPerSecond, Burst: cfg.Registration.VerifyBurst},
		Namespaces:             cfg.WorkloadNamespaces,
		DetailedDenialSources:  config.Prefixes(cfg.Endpoint.DetailedDenialSources),
		InstanceProfiles:       profiles,
	})
	return err
}

// registry is the phase of the registry's long-running parts: the
// connection states, the lifecycle (grace-period removal, replica Leases,
// WorkloadGroup drift, rolling updates on the sweeping replica) and the
// health mirror. Connection states and health reports are written until the
// xDS streams are closed and flushed at shutdown, after ctx ends.
func (b *build) registry(ctx context.Context) error {
	cfg, log := b.cfg, b.log
	trackerCtx, stopTracker := context.WithCancel(context.WithoutCancel(ctx))
	b.stopTracker = stopTracker
	b.deferUndo(stopTracker)
	connMetrics, err := presence.NewConnectionMetrics(b.reg)
	if err != nil {
		return err
	}
	if b.conns, err = presence.NewConnections(trackerCtx, presence.ConnectionOptions{
		Client: b.apiReader, Cache: b.informers, Replica: b.opts.Replica, Logger: log, Metrics: connMetrics, Writer: b.writer,
		OutOfTrafficAfter: cfg.Registration.OutOfTrafficAfter.Duration,
	}); err != nil {
		return err
	}
	// The stored connection state follows this replica's streams: a status
	// marked disconnected while they stay open is written connected again.
	go func() {
		if err := b.conns.Watch(ctx, b.informers); err != nil && ctx.Err() == nil {
			log.Error("connection reassertion watch stopped", "error", err)
		}
	}()
	lifecycleMetrics, err := lifecycle.NewMetrics(b.reg)
	if err != nil {
		return err
	}
	rollouts, err := rollout.New(rollout.Options{Client: b.kc, Cache: b.informers, Recorder: b.recorder, Logger: log})
	if err != nil {
		return err
	}
	if b.lifecycle, err = lifecycle.NewLifecycle(lifecycle.Options{
		Client: b.kc, APIReader: b.apiReader, Cache: b.informers, Kube: b.cs,
		Replica: b.opts.Replica, LeaseNamespace: cfg.Namespace,
		GracePeriod: cfg.Registration.GracePeriod.Duration, RemovalQPS: cfg.Registration.SweepRatePerSecond,
		RemovalBurst: cfg.Registration.SweepBurst, NeverConnectedAfter: cfg.Registration.NeverConnectedAfter.Duration,
		Writer: b.writer, Recorder: b.recorder, Metrics: lifecycleMetrics, Logger: log,
		Leading: []func(context.Context) error{rollouts.Run},
	}); err != nil {
		return err
	}
	// The lifecycle, and with it the replica's Lease, outlives ctx until
	// the connection states are flushed at shutdown (stopLifecycle): the
	// shutdown asks it first whether to hand the workloads over (HandOver)
	// or release the Lease once the disconnects are stored.
	lifecycleCtx, stopLifecycle := context.WithCancel(context.WithoutCancel(ctx))
	b.stopLifecycle, b.lifecycleDone = stopLifecycle, make(chan struct{})
	b.deferUndo(stopLifecycle)
	b.lifecycleErr = make(chan error, 1)
	go func() {
		defer close(b.lifecycleDone)
		b.lifecycleErr <- b.lifecycle.Start(lifecycleCtx)
	}()
	select {
	case <-b.lifecycle.Ready():
	case err := <-b.lifecycleErr:
		return fmt.Errorf("replica lease: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	healthMetrics, err := presence.NewHealthMetrics(b.reg, b.informers, presence.FleetFromLeader(b.lifecycle.IsLeader))
	if err != nil {
		return err
	}
	damping := cfg.Registration.HealthDamping.Duration
	if damping == 0 {
		damping = -1 // 0 in the file disables damping
	}
	if b.healthMirror, err = presence.NewHealthMirror(trackerCtx, presence.HealthOptions{
		Client: b.apiReader, Connections: b.conns, Damping: damping, Metrics: healthMetrics, Logger: log, Writer: b.writer,
	}); err != nil {
		return err
	}
	b.deferUndo(func() { stopTracker(); b.healthMirror.Wait() })
	return nil
}

// xds is the phase of what each sidecar is served: relayed from istiod
// (istiod mode; one connection to istiod serves both relays, certificates
// and xDS), or translated from the cached Sidecars, Services,
// EndpointSlices, ServiceEntries and WorkloadEntries (standalone); and of
// the xDS server and the listeners' limits.
func (b *build) xds(ctx context.Context) error {
	cfg, log := b.cfg, b.log
	var err error
	if b.istiodConn, err = dialIstiod(ctx, cfg, b.reg, log); err != nil {
		return err
	}
	if b.istiodConn != nil {
		b.deferUndo(func() { _ = b.istiodConn.Close() })
	}
	if b.revisionConns, err = dialRevisions(ctx, cfg, log); err != nil {
		return err
	}
	b.deferUndo(func() { closeAll(b.revisionConns) })
	xdsRelay, err := newRelay(cfg, b.istiodConn, b.revisionConns, b.reg, log)
	if err != nil {
		return err
	}
	nackMetrics, err := xds.NewNACKMetrics(b.reg)
	if err != nil {
		return err
	}
	if xdsRelay == nil {
		// ConfigurationEnforced conditions of registrations whose workload is
		// selected by a policy standalone translation does not enforce.
		if b.enforcement, err = enforcement.New(enforcement.Options{
			Client: b.apiReader, Reader: b.informers, Logger: log, Writer: b.writer,
		}); err != nil {
			return err
		}
		// Its queue exists from NewEnforcement on: run it now, so that it
		// ends with ctx even when a later phase fails.
		go b.enforcement.Run(ctx)
		if b.configSource, err = newConfigSource(ctx, cfg, b.informers, b.recorder, b.reg, b.enforcement, log); err != nil {
			return err
		}
	}
	xdsMetrics, err := xds.NewMetrics(b.reg)
	if err != nil {
		return err
	}
	serverOpts := xds.Options{
		Connections: b.conns, TokenReviews: b.cs.AuthenticationV1().TokenReviews(),
		Reader: b.informers, APIReader: b.apiReader, Informers: b.informers,
		Health: b.healthMirror, ClusterID: cfg.Mesh.ClusterID, Logger: log,
		NACKMetrics: nackMetrics, Metrics: xdsMetrics, Relay: xdsRelay,
		FirstRequestTimeout: cfg.Limits.XDS.FirstRequestTimeout.Duration,
		Namespaces:          cfg.WorkloadNamespaces,
		Subscriptions:       subscriptionLimits(cfg),
	}
	if b.configSource != nil {
		serverOpts.Config = b.configSource
	}
	if b.revisions != nil {
		serverOpts.Revisions = b.revisions
	}
	// The streams' contexts derive from the server's: it ends at shutdown
	// once the replica has decided to hand its workloads over (stopStreams),
	// not with ctx, so that no stream closes before that decision.
	streamsCtx, stopStreams := context.WithCancel(context.WithoutCancel(ctx))
	b.stopStreams = stopStreams
	b.deferUndo(stopStreams)
	if b.xdsServer, err = xds.NewServer(streamsCtx, serverOpts); err != nil {
		return err
	}
	b.lim, err = newLimiters(cfg, b.reg)
	return err
}

// tls is the phase of the serving certificate: none with
// endpoint.plaintext, else from the Secret or the files, reloaded as they
// change.
func (b *build) tls(ctx context.Context) error {
	cfg := b.cfg
	switch {
	case cfg.Endpoint.Plaintext:
		b.log.Warn("serving the onboarding API WITHOUT TLS (endpoint.plaintext): for tests on loopback only")
	case cfg.Endpoint.SecretName != "":
		src, err := servingcert.FromSecret(ctx, b.cs, cfg.Namespace, cfg.Endpoint.SecretName, b.log)
		if err != nil {
			return err
		}
		b.servingTLS = src.TLSConfig()
		return servingcert.RegisterExpiry(b.reg, src.Current)
	default:
		src, err := servingcert.FromFiles(ctx, cfg.Endpoint.CertFile, cfg.Endpoint.KeyFile, 0, b.log)
		if err != nil {
			return err
		}
		b.servingTLS = src.TLSConfig()
		return servingcert.RegisterExpiry(b.reg, src.Current)
	}
	return nil
}

// serve is the serving phase: the gRPC and HTTP servers on the group's
// listeners until ctx ends or one of them fails, then the shutdown: the
// onboarding API drained, the xDS streams closed and their disconnects and
// health reports stored before the trackers stop.
func (b *build) serve(ctx context.Context, ls *listeners) error {
	log, servingTLS := b.log, b.servingTLS
	grpcOpts := append(b.lim.onboarding.GRPCServerOptions(), grpc.ChainUnaryInterceptor(b.metrics.UnaryInterceptor()))
	xdsOpts := b.lim.xds.GRPCServerOptions()
	if servingTLS != nil {
		grpcOpts = append(grpcOpts, limits.TLSServerOptions(servingTLS)...)
		xdsOpts = append(xdsOpts, limits.TLSServerOptions(servingTLS)...)
	}
	xg := grpc.NewServer(xdsOpts...)
	b.xdsServer.Register(xg)
	if err := serveCertificates(b.cfg, b.istiodConn, b.revisionConns, b.revisions, xg, b.xdsServer, b.reg, log); err != nil {
		ls.close()
		return err
	}
	dg := grpc.NewServer()
	b.xdsServer.RegisterDebug(dg)
	g := grpc.NewServer(grpcOpts...)
	b.server.RegisterService(g)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	repo, err := startRepository(b.cfg, ls.repository, servingTLS, b.lim.repository, b.reg, log)
	if err != nil {
		ls.close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(b.reg, promhttp.HandlerOpts{Registry: b.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if b.keys.KeySet() == nil {
			http.Error(w, "no onboarding token key", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	onboardingLis, xdsLis := b.lim.onboarding.Listen(ls.onboarding), b.lim.xds.Listen(ls.xds)
	errc := make(chan error, 7)
	go func() {
		select {
		case err := <-b.lifecycleErr:
			if err != nil {
				errc <- err
			}
		case <-ctx.Done():
		}
	}()
	go func() { errc <- g.Serve(onboardingLis) }()
	go func() { errc <- msrv.Serve(ls.metrics) }()
	go func() { errc <- xg.Serve(xdsLis) }()
	if repo != nil {
		go func() { errc <- repo.serve() }()
	}
	if ls.debug != nil {
		go func() { errc <- dg.Serve(ls.debug) }()
	}
	go func() {
		if err := b.xdsServer.Run(ctx); err != nil {
			errc <- err
		}
	}()
	if b.configSource != nil {
		go func() {
			if err := b.configSource.Run(ctx, b.xdsServer); err != nil {
				errc <- err
			}
		}()
	}
	log.Info("onboarding endpoint serving", "onboarding", ls.onboarding.Addr().String(), "xds", ls.xds.Addr().String(), "metrics", ls.metrics.Addr().String(), "replica", b.opts.Replica)
	if b.opts.Ready != nil {
		close(b.opts.Ready)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	// The replica closes its streams itself from here on: their sidecars
	// reconnect to another replica, and none is taken out of traffic. With
	// another replica alive, the closes write no disconnect: that replica
	// stores the reconnects, and this replica's Lease, left to expire,
	// covers the workloads that reconnect nowhere.
	if b.lifecycle.HandOver() {
		log.Info("handing the workloads over to the other replicas: no disconnects written, replica Lease left to expire")
		b.conns.HandOver()
	}
	b.conns.Drain()
	hs.Shutdown()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = msrv.Shutdown(shutdownCtx)
	if repo != nil {
		repo.shutdown(shutdownCtx)
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-shutdownCtx.Done():
		g.Stop()
	}
	// xDS streams never end by themselves: close them, then store the
	// disconnects before the tracker stops.
	b.stopStreams()
	xg.Stop()
	dg.Stop()
	ls.close() // what no server took over (e.g. a listener of a server that never started)
	if err := b.conns.Flush(shutdownCtx); err != nil {
		log.Error("connection states not stored at shutdown; the sweeper's replica leases cover them", "error", err)
	}
	if err := b.healthMirror.Flush(shutdownCtx); err != nil {
		log.Error("health reports not stored at shutdown; the sidecars report again when they reconnect", "error", err)
	}
	b.releaseLease()
	b.stopTracker()
	b.conns.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// releaseLease ends the lifecycle once the connection states are stored
// and waits (10 s at most) until it has released the replica's Lease.
func (b *build) releaseLease() {
	b.stopLifecycle()
	select {
	case <-b.lifecycleDone:
	case <-time.After(10 * time.Second):
		b.log.Error("replica Lease not released within 10s of the shutdown; it expires by itself")
	}
}

// topology is the registry's view of the mesh's networks (mesh.network),
// nil when the configuration names none.
func topology(n *config.MeshNetwork) *registry.Topology {
	if n == nil {
		return nil
	}
	return &registry.Topology{PodNetwork: n.Pods, PodCIDRs: config.Prefixes(n.PodCIDRs), GatewayNetworks: n.Gateways}
}
