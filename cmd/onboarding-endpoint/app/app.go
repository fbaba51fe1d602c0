// Package app wires the onboarding endpoint together from its configuration
// file: Kubernetes clients and informer cache, identity verifiers, policy
// authorizer, token issuer, registrar, the TLS-served gRPC API, the xDS
// server (with its loopback-only debug listener) and the metrics/health
// server.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/api/scheme"
	"github.com/embark-mesh/embark/onboarding/config"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/certs"
	"github.com/embark-mesh/embark/onboarding/identity/aws/profile"
	jwtidentity "github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/limits"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/onboarding/policystatus"
	"github.com/embark-mesh/embark/onboarding/servingcert"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/rollout"
	"github.com/embark-mesh/embark/version"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/configsource"
)

// Options are the command line of the endpoint.
type Options struct {
	// ConfigFile is the OnboardingEndpointConfiguration. Required.
	ConfigFile string
	// Kubeconfig; empty means in-cluster (or $KUBECONFIG).
	Kubeconfig string
	// Replica names this process (default: the host name).
	Replica string
	Logger  *slog.Logger
	// Ready, when set, is closed once the endpoint serves.
	Ready chan<- struct{}
	// DebugXDS is the loopback-only address of the unauthenticated xDS
	// debug listener (istio.io/debug/syncz for `istioctl proxy-status`,
	// reached with `kubectl port-forward`). Default 127.0.0.1:15010;
	// "off" disables it.
	DebugXDS string
	// Pprof, when set, is the loopback-only address serving Go's runtime
	// profiles (/debug/pprof/). Default off.
	Pprof string
	// EventCacheSize is the size of each LRU cache of the event correlator
	// (aggregation, spam filter, deduplication); 0 means client-go's 4096.
	// They fill as workloads come and go, a few KiB per workload, then stay
	// at the bound; the soak lowers it to reach the bound early.
	EventCacheSize int
}

// cacheOptions scopes the informer cache to what the endpoint's RBAC grants
// (docs/security.md, "Least privilege"): with workloadNamespaces set, every
// namespaced informer watches only those namespaces (one watch per
// namespace, each allowed by that namespace's RoleBinding); in standalone
// mode the mesh configuration translation reads (Services, EndpointSlices,
// Pods, ServiceEntries, WorkloadEntries, Sidecars, security policies) is
// watched cluster-wide, read-only, as istiod watches it: a VM calls
// services in any namespace. Secrets are only the sidecar credentials
// (label-filtered; the xDS server checks a token's bound Secret against
// them); Pods keep only what translation reads of them.
func cacheOptions(cfg *config.Configuration, sch *runtime.Scheme) cache.Options {
	opts := cache.Options{Scheme: sch, ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{registry.LabelSidecarCredential: "true"})},
		&corev1.Pod{}:    {Transform: configsource.TrimPod},
	}}
	if len(cfg.WorkloadNamespaces) == 0 {
		return opts
	}
	opts.DefaultNamespaces = map[string]cache.Config{}
	for _, ns := range cfg.WorkloadNamespaces {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	if cfg.Istiod.Relays() {
		return opts
	}
	all := map[string]cache.Config{cache.AllNamespaces: {}}
	for _, obj := range configsource.MeshConfig() {
		key := obj
		for k := range opts.ByObject { // Pods: keep their Transform
			if reflect.TypeOf(k) == reflect.TypeOf(obj) {
				key = k
			}
		}
		by := opts.ByObject[key]
		by.Namespaces = all
		opts.ByObject[key] = by
	}
	return opts
}

// DefaultDebugXDS is the default address of the xDS debug listener.
const DefaultDebugXDS = "127.0.0.1:15010"

// Run runs the endpoint until ctx ends.
func Run(ctx context.Context, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg, err := config.Load(opts.ConfigFile)
	if err != nil {
		return err
	}
	if opts.Replica == "" {
		opts.Replica, _ = os.Hostname()
	}
	restCfg, err := restConfig(opts.Kubeconfig)
	if err != nil {
		return err
	}
	if restCfg.QPS == 0 {
		// client-go's default (5 QPS, burst 10 per client) would throttle
		// far below registration.writeQPS: the soak (test/soak) showed
		// connection bookkeeping falling minutes behind at 2 onboardings/s.
		// Every write is read first, so allow twice the write budget.
		restCfg.QPS = float32(2 * cfg.Registration.WriteQPS)
		restCfg.Burst = 2 * cfg.Registration.WriteBurst
	}
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	if opts.DebugXDS == "" {
		opts.DebugXDS = DefaultDebugXDS
	}
	if opts.DebugXDS != "off" {
		if err := xds.CheckLoopback(opts.DebugXDS); err != nil {
			return err
		}
	}
	if opts.Pprof != "" {
		_, stopPprof, err := startPprof(opts.Pprof, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	informers, err := cache.New(restCfg, cacheOptions(cfg, sch))
	if err != nil {
		return fmt.Errorf("informer cache: %w", err)
	}
	if err := registry.SetupIndexes(ctx, informers); err != nil {
		return err
	}
	kc, err := client.New(restCfg, client.Options{Scheme: sch, Cache: &client.CacheOptions{Reader: informers}})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	go func() {
		if err := informers.Start(ctx); err != nil {
			log.Error("informer cache stopped", "error", err)
		}
	}()
	if !informers.WaitForCacheSync(ctx) {
		return fmt.Errorf("informer cache did not start: %w", context.Cause(ctx))
	}
	// Every informer a request reads is synced here, before the endpoint is
	// ready: a missing permission then holds start-up (and the reflector logs
	// "forbidden") instead of hanging the first request that needs it.
	for _, l := range []client.ObjectList{&istionetworkingv1.WorkloadGroupList{}, &istionetworkingv1.WorkloadEntryList{}, &authorizationv1alpha1.OnboardingPolicyList{},
		&runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.SecretList{}, &corev1.ServiceAccountList{}} {
		if err := informers.List(ctx, l); err != nil { // starts the informer and waits for its sync
			return fmt.Errorf("sync informer for %T: %w", l, err)
		}
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: opts.EventCacheSize}))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(sch, corev1.EventSource{Component: "onboarding-endpoint", Host: opts.Replica})

	reg := prometheus.NewRegistry()
	// go_gc_heap_live_bytes (the heap the last collection kept) besides the
	// default Go metrics: what the soak checks for leaks.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := version.Register(reg); err != nil {
		return err
	}
	metrics, err := endpoint.NewMetrics(reg)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}

	// Onboarding token keys: created on first start, shared by replicas.
	if _, err := token.EnsureKeySecret(ctx, cs.CoreV1(), cfg.Namespace, cfg.TokenIssuer.JWT.SigningKeySecret); err != nil {
		return fmt.Errorf("onboarding token signing key: %w", err)
	}
	keys := token.NewSecretKeySource(cs.CoreV1(), cfg.Namespace, cfg.TokenIssuer.JWT.SigningKeySecret, token.WithSourceLogger(log))
	go func() {
		if err := keys.Start(ctx); err != nil && ctx.Err() == nil {
			log.Error("onboarding token key watch stopped", "error", err)
		}
	}()
	if err := keys.WaitForKeys(ctx); err != nil {
		return fmt.Errorf("onboarding token signing key: %w", err)
	}
	tokens, err := token.NewIssuer(keys, "https://"+cfg.Audience(), cfg.Audience(),
		token.WithLifetime(cfg.TokenIssuer.JWT.Expiration.Duration), token.WithLogger(log))
	if err != nil {
		return fmt.Errorf("onboarding token issuer: %w", err)
	}

	awsVerifier, err := newAWSVerifier(cfg, log)
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
		if jwtVerifier, err = newJWTVerifier(cfg, log); err != nil {
			return err
		}
	}
	// OnboardingPolicy status: selected WorkloadGroups and this replica's
	// decisions, written when they change.
	decisions := policystatus.NewDecisions()
	authz, err := policy.NewAuthorizer(informers, recorder, policy.WithLogger(log), policy.WithDecisionRecorder(decisions))
	if err != nil {
		return err
	}
	policyStatus, err := policystatus.New(policystatus.Options{Client: kc, Cache: informers, Decisions: decisions, Logger: log})
	if err != nil {
		return err
	}
	if err := triggerOn(ctx, informers, policyStatus.Trigger, &authorizationv1alpha1.OnboardingPolicy{}, &istionetworkingv1.WorkloadGroup{}); err != nil {
		return err
	}
	statusCtx, stopStatus := context.WithCancel(ctx)
	statusDone := make(chan struct{})
	go func() { defer close(statusDone); _ = policyStatus.Run(statusCtx) }()
	defer func() { stopStatus(); <-statusDone }()
	registrar, err := registry.NewRegistrar(registry.Options{
		Client: kc, Cache: informers, Recorder: recorder, Logger: log,
		Writes: registry.WriteOptions{QPS: cfg.Registration.WriteQPS, Burst: cfg.Registration.WriteBurst},
	})
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
	server, err := endpoint.NewServer(endpoint.Options{
		AWS: awsVerifier, JWT: jwtVerifier, Authorizer: authz, Tokens: tokens, Registrar: registrar, Client: kc,
		Bootstrap: endpoint.BootstrapSettings{
			DiscoveryAddress: cfg.Mesh.DiscoveryAddress, ClusterID: cfg.Mesh.ClusterID, TrustDomain: cfg.Mesh.TrustDomain,
			RootCertFile: cfg.Mesh.RootCertFile,
		},
		PropagationDelay:       cfg.Registration.PropagationDelay.Duration,
		Logger:                 log,
		Metrics:                metrics,
		Recorder:               recorder,
		ServiceCIDRs:           config.Prefixes(cfg.Registration.ServiceCIDRs),
		Source:                 sourceCheck(cfg.Registration.SourceAddressCheck),
		AllowLoopbackAddresses: cfg.Registration.AllowLoopbackAddresses,
		VerifyLimit:            endpoint.RateLimit{PerSecond: cfg.Registration.VerifyPerSecond, Burst: cfg.Registration.VerifyBurst},
		Namespaces:             cfg.WorkloadNamespaces,
		InstanceProfiles:       profiles,
	})
	if err != nil {
		return err
	}

	// Connection state is written until the xDS streams are closed and
	// flushed at shutdown, after ctx ends.
	trackerCtx, stopTracker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTracker()
	connMetrics, err := registry.NewConnectionMetrics(reg)
	if err != nil {
		return err
	}
	apiReader, err := client.New(restCfg, client.Options{Scheme: sch})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	conns, err := registry.NewConnections(trackerCtx, registry.ConnectionOptions{
		Client: apiReader, Replica: opts.Replica, Logger: log, Metrics: connMetrics,
		Writes: registry.WriteOptions{QPS: cfg.Registration.WriteQPS, Burst: cfg.Registration.WriteBurst},
	})
	if err != nil {
		return err
	}
	// Grace-period removal, replica liveness and WorkloadGroup drift.
	lifecycleMetrics, err := registry.NewLifecycleMetrics(reg)
	if err != nil {
		return err
	}
	// Rolling updates of opted-in WorkloadGroups, on the sweeping replica.
	rollouts, err := rollout.New(rollout.Options{Client: kc, Cache: informers, Recorder: recorder, Logger: log})
	if err != nil {
		return err
	}
	lifecycle, err := registry.NewLifecycle(registry.LifecycleOptions{
		Client: kc, APIReader: apiReader, Cache: informers, Kube: cs,
		Replica: opts.Replica, LeaseNamespace: cfg.Namespace,
		GracePeriod: cfg.Registration.GracePeriod.Duration, RemovalQPS: cfg.Registration.SweepRatePerSecond,
		RemovalBurst: cfg.Registration.SweepBurst, NeverConnectedAfter: cfg.Registration.NeverConnectedAfter.Duration,
		Writes:   registry.WriteOptions{QPS: cfg.Registration.WriteQPS, Burst: cfg.Registration.WriteBurst},
		Recorder: recorder, Metrics: lifecycleMetrics, Logger: log,
		Leading: []func(context.Context) error{rollouts.Run},
	})
	if err != nil {
		return err
	}
	lifecycleErr := make(chan error, 1)
	go func() { lifecycleErr <- lifecycle.Start(ctx) }()
	select {
	case <-lifecycle.Ready():
	case err := <-lifecycleErr:
		return fmt.Errorf("replica lease: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	// Health reports mirrored onto WorkloadEntries, written until shutdown
	// like the connection states.
	healthMetrics, err := registry.NewHealthMetrics(reg, informers, registry.FleetFromLeader(lifecycle.IsLeader))
	if err != nil {
		return err
	}
	damping := cfg.Registration.HealthDamping.Duration
	if damping == 0 {
		damping = -1 // 0 in the file disables damping
	}
	healthMirror, err := registry.NewHealthMirror(trackerCtx, registry.HealthOptions{
		Client: apiReader, Connections: conns, Damping: damping, Metrics: healthMetrics, Logger: log,
		Writes: registry.WriteOptions{QPS: cfg.Registration.WriteQPS, Burst: cfg.Registration.WriteBurst},
	})
	if err != nil {
		return err
	}
	defer func() { stopTracker(); healthMirror.Wait() }()

	// What each sidecar is served: relayed from istiod (istiod mode), or
	// translated from the cached Sidecars, Services, EndpointSlices,
	// ServiceEntries and WorkloadEntries (standalone).
	// One connection to istiod serves both relays (certificates, xDS).
	istiodConn, err := dialIstiod(ctx, cfg, log)
	if err != nil {
		return err
	}
	if istiodConn != nil {
		defer func() { _ = istiodConn.Close() }()
	}
	xdsRelay, err := newRelay(cfg, istiodConn, reg, log)
	if err != nil {
		return err
	}
	nackMetrics, err := xds.NewNACKMetrics(reg)
	if err != nil {
		return err
	}
	var configSource *configsource.Source
	var enforcement *registry.Enforcement
	if xdsRelay == nil {
		// ConfigurationEnforced conditions of registrations whose workload is
		// selected by a policy standalone translation does not enforce.
		enforcement, err = registry.NewEnforcement(registry.EnforcementOptions{
			Client: apiReader, Reader: informers, Logger: log,
			Writes: registry.WriteOptions{QPS: cfg.Registration.WriteQPS, Burst: cfg.Registration.WriteBurst},
		})
		if err != nil {
			return err
		}
		if configSource, err = newConfigSource(ctx, cfg, informers, recorder, reg, enforcement, log); err != nil {
			return err
		}
	}

	xdsMetrics, err := xds.NewMetrics(reg)
	if err != nil {
		return err
	}
	serverOpts := xds.Options{
		Connections: conns, TokenReviews: cs.AuthenticationV1().TokenReviews(),
		Reader: informers, APIReader: apiReader, Informers: informers,
		Health: healthMirror, ClusterID: cfg.Mesh.ClusterID, Logger: log,
		NACKMetrics: nackMetrics, Metrics: xdsMetrics, Relay: xdsRelay,
		FirstRequestTimeout: cfg.Limits.XDS.FirstRequestTimeout.Duration,
		Namespaces:          cfg.WorkloadNamespaces,
	}
	if configSource != nil {
		serverOpts.Config = configSource
	}
	xdsServer, err := xds.NewServer(ctx, serverOpts)
	if err != nil {
		return err
	}
	lim, err := newLimiters(cfg, reg)
	if err != nil {
		return err
	}

	grpcOpts := append(lim.onboarding.GRPCServerOptions(), grpc.ChainUnaryInterceptor(metrics.UnaryInterceptor()))
	xdsOpts := lim.xds.GRPCServerOptions()
	var servingTLS *tls.Config // nil when plaintext; the local repository serves with it
	switch {
	case cfg.Endpoint.Plaintext:
		log.Warn("serving the onboarding API WITHOUT TLS (endpoint.plaintext): for tests on loopback only")
	case cfg.Endpoint.SecretName != "":
		src, err := servingcert.FromSecret(ctx, cs, cfg.Namespace, cfg.Endpoint.SecretName, log)
		if err != nil {
			return err
		}
		grpcOpts = append(grpcOpts, limits.TLSServerOptions(src.TLSConfig())...)
		xdsOpts = append(xdsOpts, limits.TLSServerOptions(src.TLSConfig())...)
		servingTLS = src.TLSConfig()
	default:
		src, err := servingcert.FromFiles(ctx, cfg.Endpoint.CertFile, cfg.Endpoint.KeyFile, 0, log)
		if err != nil {
			return err
		}
		grpcOpts = append(grpcOpts, limits.TLSServerOptions(src.TLSConfig())...)
		xdsOpts = append(xdsOpts, limits.TLSServerOptions(src.TLSConfig())...)
		servingTLS = src.TLSConfig()
	}
	xg := grpc.NewServer(xdsOpts...)
	xdsServer.Register(xg)
	if err := serveCertificates(cfg, istiodConn, xg, xdsServer, reg, log); err != nil {
		return err
	}
	dg := grpc.NewServer()
	xdsServer.RegisterDebug(dg)
	g := grpc.NewServer(grpcOpts...)
	server.RegisterService(g)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)

	lis, err := net.Listen("tcp", cfg.Listen.Onboarding)
	if err != nil {
		return fmt.Errorf("listen on %s (listen.onboarding): %w", cfg.Listen.Onboarding, err)
	}
	mlis, err := net.Listen("tcp", cfg.Listen.Metrics)
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("listen on %s (listen.metrics): %w", cfg.Listen.Metrics, err)
	}
	xlis, err := net.Listen("tcp", cfg.Listen.XDS)
	if err != nil {
		_ = lis.Close()
		_ = mlis.Close()
		return fmt.Errorf("listen on %s (listen.xds): %w", cfg.Listen.XDS, err)
	}
	var dlis net.Listener
	if opts.DebugXDS != "off" {
		if dlis, err = net.Listen("tcp", opts.DebugXDS); err != nil {
			_ = lis.Close()
			_ = mlis.Close()
			_ = xlis.Close()
			return fmt.Errorf("listen on %s (xDS debug): %w", opts.DebugXDS, err)
		}
	}
	lis, xlis = lim.onboarding.Listen(lis), lim.xds.Listen(xlis)
	repo, err := startRepository(cfg, servingTLS, lim.repository, log)
	if err != nil {
		_ = lis.Close()
		_ = mlis.Close()
		_ = xlis.Close()
		if dlis != nil {
			_ = dlis.Close()
		}
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if keys.KeySet() == nil {
			http.Error(w, "no onboarding token key", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 7)
	go func() {
		if err := <-lifecycleErr; err != nil {
			errc <- err
		}
	}()
	go func() { errc <- g.Serve(lis) }()
	go func() { errc <- msrv.Serve(mlis) }()
	go func() { errc <- xg.Serve(xlis) }()
	if repo != nil {
		go func() { errc <- repo.serve() }()
	}
	if dlis != nil {
		go func() { errc <- dg.Serve(dlis) }()
	}
	go func() {
		if err := xdsServer.Run(ctx); err != nil {
			errc <- err
		}
	}()
	if configSource != nil {
		go func() {
			if err := configSource.Run(ctx, xdsServer); err != nil {
				errc <- err
			}
		}()
		go enforcement.Run(ctx)
	}
	log.Info("onboarding endpoint serving", "onboarding", lis.Addr().String(), "xds", xlis.Addr().String(), "metrics", mlis.Addr().String(), "replica", opts.Replica)
	if opts.Ready != nil {
		close(opts.Ready)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
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
	xg.Stop()
	dg.Stop()
	if err := conns.Flush(shutdownCtx); err != nil {
		log.Error("connection states not stored at shutdown; the sweeper's replica leases cover them", "error", err)
	}
	if err := healthMirror.Flush(shutdownCtx); err != nil {
		log.Error("health reports not stored at shutdown; the sidecars report again when they reconnect", "error", err)
	}
	stopTracker()
	conns.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	return cfg, nil
}

func newAWSVerifier(cfg *config.Configuration, log *slog.Logger) (*awsidentity.Verifier, error) {
	opts := []awsidentity.Option{awsidentity.WithLogger(log)}
	if dir := cfg.Identity.AWS.CertificatesDir; dir != "" {
		set, err := certs.LoadDirPath(dir)
		if err != nil {
			return nil, fmt.Errorf("identity.aws.certificatesDir: %w", err)
		}
		opts = append(opts, awsidentity.WithTrustedCertificates(set))
	}
	if ep := cfg.Identity.AWS.STSEndpoint; ep != "" {
		opts = append(opts, awsidentity.WithSTSEndpoint(ep))
	}
	v, err := awsidentity.NewVerifier(cfg.Audience(), opts...)
	if err != nil {
		return nil, fmt.Errorf("AWS identity verifier: %w", err)
	}
	return v, nil
}

// newProfileChecker returns the EC2 instance profile check of
// identity.aws.instanceProfileCheck; nil when it is not configured.
func newProfileChecker(ctx context.Context, cfg *config.Configuration, log *slog.Logger) (*profile.Checker, error) {
	pc := cfg.Identity.AWS.InstanceProfileCheck
	if pc == nil {
		return nil, nil
	}
	clients, err := profile.NewClients(ctx, profile.ClientOptions{RoleARN: pc.RoleARN,
		EC2Endpoint: pc.EC2Endpoint, IAMEndpoint: pc.IAMEndpoint, STSEndpoint: pc.STSEndpoint})
	if err != nil {
		return nil, fmt.Errorf("identity.aws.instanceProfileCheck: %w", err)
	}
	opts := profile.Options{Clients: clients, Rate: pc.RatePerSecond, Burst: pc.Burst, Logger: log}
	if pc.CacheTTL != nil {
		opts.CacheTTL = pc.CacheTTL.Duration
	}
	c, err := profile.New(opts)
	if err != nil {
		return nil, fmt.Errorf("identity.aws.instanceProfileCheck: %w", err)
	}
	log.Info("confirming STS-proven roles with the instances' instance profiles (EC2, IAM)", "roleARN", pc.RoleARN)
	return c, nil
}

func newJWTVerifier(cfg *config.Configuration, log *slog.Logger) (*jwtidentity.Verifier, error) {
	issuers := make([]jwtidentity.IssuerConfig, 0, len(cfg.Identity.JWT))
	for _, j := range cfg.Identity.JWT {
		is := jwtidentity.IssuerConfig{
			Issuer: j.Issuer, ShortName: j.ShortName, Audiences: j.Audiences,
			JWKS: []byte(j.JWKS), JWKSURL: j.JWKSURL, Attributes: j.Attributes,
			AllowTokensWithoutJTI: j.AllowTokensWithoutJTI, SubjectPrefix: j.SubjectPrefix,
		}
		if j.MaxTokenLifetime != nil {
			is.MaxTokenLifetime = j.MaxTokenLifetime.Duration
		}
		if j.CAFile != "" {
			ca, err := os.ReadFile(j.CAFile)
			if err != nil {
				return nil, fmt.Errorf("identity.jwt %s: caFile: %w", j.Issuer, err)
			}
			is.CACertificates = ca
		}
		issuers = append(issuers, is)
	}
	v, err := jwtidentity.NewVerifier(issuers, jwtidentity.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("identity.jwt: %w", err)
	}
	return v, nil
}

// sourceCheck converts the configuration's source address check.
func sourceCheck(c *config.SourceAddressCheck) endpoint.SourceCheck {
	if c == nil {
		return endpoint.SourceCheck{}
	}
	return endpoint.SourceCheck{Enabled: c.Enabled, TrustedProxies: config.Prefixes(c.TrustedProxyCIDRs)}
}

// triggerOn calls trigger on every add, update and delete of the objects'
// kinds in the informer cache.
func triggerOn(ctx context.Context, informers cache.Cache, trigger func(), objs ...client.Object) error {
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { trigger() },
		UpdateFunc: func(any, any) { trigger() },
		DeleteFunc: func(any) { trigger() },
	}
	for _, o := range objs {
		inf, err := informers.GetInformer(ctx, o)
		if err != nil {
			return fmt.Errorf("informer for %T: %w", o, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("event handler for %T: %w", o, err)
		}
	}
	return nil
}
