// Package app wires the onboarding endpoint together from its configuration
// file: Kubernetes clients and informer cache, identity verifiers, policy
// authorizer, token issuer, registrar, the TLS-served gRPC API, the xDS
// server (with its loopback-only debug listener) and the metrics/health
// server.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"

	"golang.org/x/oauth2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/certs"
	"github.com/embark-mesh/embark/onboarding/identity/aws/profile"
	azureidentity "github.com/embark-mesh/embark/onboarding/identity/azure"
	ecsidentity "github.com/embark-mesh/embark/onboarding/identity/ecs"
	gceidentity "github.com/embark-mesh/embark/onboarding/identity/gce"
	jwtidentity "github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/registry"
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

// Run runs the endpoint until ctx ends. It builds the endpoint in named
// phases (see build), opens its listeners as one group, serves, and shuts
// down in the reverse order; a phase that fails undoes what the earlier
// ones started: every goroutine ends with Run and no listener stays open.
func Run(ctx context.Context, opts Options) error {
	ctx, cancel := context.WithCancel(ctx) // ends what the phases start in the background
	defer cancel()
	b, err := newBuild(opts)
	if err != nil {
		return err
	}
	defer b.undo()
	for _, phase := range []func(context.Context) error{
		b.kubernetes,    // clients, informer cache synced
		b.observability, // events, metrics registry
		b.onboarding,    // token issuer, identity verifiers, policy, registrar, the onboarding API
		b.registry,      // connection states, lifecycle (sweeper, leases, rollouts), health mirror
		b.xds,           // istiod relay or standalone translation, the xDS server
		b.tls,           // the serving certificate
	} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	ls, err := b.listen()
	if err != nil {
		return err
	}
	return b.serve(ctx, ls)
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

func newAWSVerifier(cfg *config.Configuration, log *slog.Logger, used replay.Shared) (*awsidentity.Verifier, error) {
	opts := []awsidentity.Option{awsidentity.WithLogger(log), awsidentity.WithSharedReplay(used)}
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
	c, err := profile.New(profile.Options{Clients: clients, Options: apiCheckOptions(pc.APICallBudget, log)})
	if err != nil {
		return nil, fmt.Errorf("identity.aws.instanceProfileCheck: %w", err)
	}
	log.Info("confirming STS-proven roles with the instances' instance profiles (EC2, IAM)", "roleARN", pc.RoleARN)
	return c, nil
}

func newJWTVerifier(cfg *config.Configuration, log *slog.Logger, used replay.Shared) (*jwtidentity.Verifier, error) {
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
	v, err := jwtidentity.NewVerifier(issuers, jwtidentity.WithLogger(log), jwtidentity.WithSharedReplay(used))
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

// newGCEVerifier returns the GCE instance identity token verifier of
// identity.gce, confirming instances with the Compute API when
// instanceCheck is set.
func newGCEVerifier(ctx context.Context, g *config.GCEIdentity, log *slog.Logger, used replay.Shared) (*gceidentity.Verifier, error) {
	c := gceidentity.Config{Audiences: g.Audiences, JWKSURL: g.JWKSURL}
	if g.MaxTokenLifetime != nil {
		c.MaxTokenLifetime = g.MaxTokenLifetime.Duration
	}
	if g.CAFile != "" {
		ca, err := os.ReadFile(g.CAFile)
		if err != nil {
			return nil, fmt.Errorf("identity.gce.caFile: %w", err)
		}
		c.CACertificates = ca
	}
	if g.InstanceCheck != nil {
		checker, err := newGCEInstanceChecker(ctx, g.InstanceCheck, log)
		if err != nil {
			return nil, fmt.Errorf("identity.gce.instanceCheck: %w", err)
		}
		c.InstanceCheck = checker
	}
	v, err := gceidentity.NewVerifier(c, jwtidentity.WithLogger(log), jwtidentity.WithSharedReplay(used))
	if err != nil {
		return nil, fmt.Errorf("identity.gce: %w", err)
	}
	log.Info("accepting GCE instance identity tokens", "audiences", c.Audiences, "jwksURL", v.JWKSURL(), "instanceCheck", g.InstanceCheck != nil)
	return v, nil
}

// newGCEInstanceChecker returns the Compute API checker of
// identity.gce.instanceCheck, with the credentials of its credentialsFile
// (a service account key) or else the Application Default Credentials.
func newGCEInstanceChecker(ctx context.Context, ic *config.GCEInstanceCheck, log *slog.Logger) (*gceidentity.Checker, error) {
	var ts oauth2.TokenSource
	var err error
	if ic.CredentialsFile != "" {
		key, rerr := os.ReadFile(ic.CredentialsFile)
		if rerr != nil {
			return nil, fmt.Errorf("credentialsFile: %w", rerr)
		}
		ts, err = gceidentity.CredentialsFromServiceAccountKey(ctx, key)
	} else {
		ts, err = gceidentity.DefaultTokenSource(ctx)
	}
	if err != nil {
		return nil, err
	}
	return gceidentity.NewChecker(gceidentity.CheckerOptions{TokenSource: ts, Endpoint: ic.ComputeEndpoint, Options: apiCheckOptions(ic.APICallBudget, log)})
}

func newAzureVerifier(a *config.AzureIdentity, log *slog.Logger, used replay.Shared) (*azureidentity.Verifier, error) {
	c := azureidentity.Config{Tenants: a.Tenants, Audiences: a.Audiences, JWKSURL: a.JWKSURL}
	if a.MaxTokenLifetime != nil {
		c.MaxTokenLifetime = a.MaxTokenLifetime.Duration
	}
	if a.CAFile != "" {
		ca, err := os.ReadFile(a.CAFile)
		if err != nil {
			return nil, fmt.Errorf("identity.azure.caFile: %w", err)
		}
		c.CACertificates = ca
	}
	if vc := a.VMCheck; vc != nil {
		checker, err := newAzureVMChecker(vc, log)
		if err != nil {
			return nil, fmt.Errorf("identity.azure.vmCheck: %w", err)
		}
		c.VMCheck = checker
	}
	v, err := azureidentity.NewVerifier(c, jwtidentity.WithLogger(log), jwtidentity.WithSharedReplay(used))
	if err != nil {
		return nil, fmt.Errorf("identity.azure: %w", err)
	}
	log.Info("accepting Azure VM managed identity tokens", "tenants", c.Tenants, "audiences", c.Audiences, "jwksURL", v.JWKSURL(), "vmCheck", a.VMCheck != nil)
	return v, nil
}

// newAzureVMChecker returns the Resource Manager check of vmCheck, with the
// endpoint's own token from workload identity or IMDS.
func newAzureVMChecker(vc *config.AzureVMCheck, log *slog.Logger) (*azureidentity.Checker, error) {
	src, err := azureidentity.NewTokenSource(azureidentity.TokenSourceOptions{IMDSEndpoint: vc.IMDSEndpoint})
	if err != nil {
		return nil, err
	}
	return azureidentity.NewChecker(azureidentity.CheckerOptions{Token: src, ARMEndpoint: vc.ARMEndpoint, Options: apiCheckOptions(vc.APICallBudget, log)})
}

// newECSVerifier returns the ECS task verifier of identity.ecs: STS proofs
// go through awsVerifier (its audience, STS endpoint and record of used
// requests), tasks are confirmed with the ECS API when taskCheck is set.
func newECSVerifier(ctx context.Context, e *config.ECSIdentity, awsVerifier *awsidentity.Verifier, log *slog.Logger) (*ecsidentity.Verifier, error) {
	var checker ecsidentity.TaskChecker // nil interface when not configured
	if tc := e.TaskCheck; tc != nil {
		clients, err := ecsidentity.NewClients(ctx, ecsidentity.ClientOptions{RoleARN: tc.RoleARN, ECSEndpoint: tc.ECSEndpoint, STSEndpoint: tc.STSEndpoint})
		if err != nil {
			return nil, fmt.Errorf("identity.ecs.taskCheck: %w", err)
		}
		c, err := ecsidentity.NewChecker(ecsidentity.CheckerOptions{Clients: clients, Options: apiCheckOptions(tc.APICallBudget, log)})
		if err != nil {
			return nil, fmt.Errorf("identity.ecs.taskCheck: %w", err)
		}
		checker = c
	}
	v, err := ecsidentity.NewVerifier(awsVerifier, checker)
	if err != nil {
		return nil, fmt.Errorf("identity.ecs: %w", err)
	}
	log.Info("accepting ECS task role credentials", "taskCheck", checker != nil)
	return v, nil
}

// apiCheckOptions are the options of a cloud API check whose configuration
// says b about its calls.
func apiCheckOptions(b config.APICallBudget, log *slog.Logger) apicheck.Options {
	o := apicheck.Options{Rate: b.RatePerSecond, Burst: b.Burst, Logger: log}
	if b.CacheTTL != nil {
		o.CacheTTL = b.CacheTTL.Duration
	}
	return o
}
