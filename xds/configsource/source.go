package configsource

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/translate"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/internal/snapcache"
)

// Defaults.
const (
	DefaultDebounce      = 100 * time.Millisecond
	DefaultRootNamespace = "istio-system"
)

// Event reasons.
const (
	// ReasonInvalidConfiguration (Warning) is recorded on the Sidecar (or the
	// registration) whose translation failed; the proxy keeps its previous
	// configuration.
	ReasonInvalidConfiguration = "InvalidConfiguration"
	// ReasonConfigurationWarning (Warning) is recorded on the Sidecar (or
	// the workload's registration) when a configuration is served but
	// leaves something out (translate.Result.Warnings: a field not
	// translated, an ambiguous TCP port), once per node and distinct set.
	ReasonConfigurationWarning = "ConfigurationWarning"
)

// Cache reads and watches the inputs (controller-runtime's cache.Cache
// satisfies it).
type Cache interface {
	client.Reader
	xds.Informers
}

// Options configures a Source. Every field documents its default.
type Options struct {
	// Cache holds the objects of Watched(): Sidecars, Services,
	// EndpointSlices, ServiceEntries, WorkloadEntries, Pods,
	// PeerAuthentications, AuthorizationPolicies, RequestAuthentications and
	// WorkloadAutoRegistrations. Required.
	Cache Cache
	// Mesh settings handed to translation (trust domain, cluster ID).
	Mesh translate.Mesh
	// RootNamespace is Istio's config root namespace. Default istio-system.
	RootNamespace string
	// Debounce is how long the inputs must be quiet before affected proxies
	// are recomputed; a batch waits at most 10 times as long. Default 100ms.
	Debounce time.Duration
	// Recorder records InvalidConfiguration Events. Default: none recorded.
	Recorder record.EventRecorder
	// Metrics. Default: not counted.
	Metrics *Metrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Clock. Default time.Now.
	Clock func() time.Time
	// Enforcement is told, for each workload, which policies selecting it
	// are not enforced (its inbound listeners refuse all traffic then), so
	// its registration's ConfigurationEnforced condition says so
	// (*enforcement.ConditionWriter). Default: no condition written.
	Enforcement EnforcementReporter
}

// EnforcementReporter records which policies selecting a workload are not
// enforced (*enforcement.ConditionWriter satisfies it). Set must not block.
type EnforcementReporter interface {
	Set(key ktypes.NamespacedName, unenforced []string)
}

// Source is an xds.ConfigSource fed by informers. Run it to push changes.
type Source struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	served map[string]*served // by node ID
	// workloads are the nodes' workloads as their registrations describe
	// them, by node ID (see workloadOf).
	workloads map[string]*workloadOf
	// owns are the nodes' own resources as last built, by node ID (see
	// own).
	owns map[string]*ownParts

	// scopes are the translations of the scopes proxies were served from,
	// shared while the inputs do not change.
	scopes scopes
	// endpoints is the endpoint index translations share while the
	// EndpointSlices, Pods and WorkloadEntries do not change.
	endpoints endpointIndex
}

// served is what a node was last served successfully, and its last error.
type served struct {
	snap     cache.ResourceSnapshot
	lastErr  string
	lastWarn string
	// unenforced is what was last reported of the policies not enforced.
	unenforced string
}

var (
	_ xds.ConfigSource  = (*Source)(nil)
	_ xds.NodeForgetter = (*Source)(nil)
)

// New returns a Source.
func New(opts Options) (*Source, error) {
	if opts.Cache == nil {
		return nil, errors.New("configsource: Cache is required")
	}
	if opts.RootNamespace == "" {
		opts.RootNamespace = DefaultRootNamespace
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	return &Source{opts: opts, log: opts.Logger, served: map[string]*served{}, workloads: map[string]*workloadOf{}, owns: map[string]*ownParts{}}, nil
}

// Snapshot implements xds.ConfigSource: the proxy's translated
// configuration, or, when translation fails, the last one that succeeded
// (an empty one if none did). It fails only when no configuration at all can
// be given.
func (s *Source) Snapshot(ctx context.Context, p *xds.Proxy) (cache.ResourceSnapshot, error) {
	start := s.opts.Clock()
	snap, warned, blame, reason, err := s.compute(ctx, p)
	m := s.opts.Metrics
	if m != nil {
		m.configurations.Inc()
		m.translate.Observe(s.opts.Clock().Sub(start).Seconds())
	}
	s.mu.Lock()
	prev := s.served[p.NodeID]
	if prev == nil {
		prev = &served{}
		s.served[p.NodeID] = prev
	}
	if err == nil {
		warnings := strings.Join(warned.warnings, "; ")
		newWarning := warnings != "" && warnings != prev.lastWarn
		unenforced := strings.Join(warned.unenforced, "; ")
		// The first configuration of a node always reports, so a condition
		// another replica (or an earlier stream) left behind is corrected.
		report := prev.snap == nil || unenforced != prev.unenforced
		prev.snap, prev.lastErr, prev.lastWarn, prev.unenforced = snap, "", warnings, unenforced
		s.mu.Unlock()
		if report {
			s.reportEnforcement(p, warned.unenforced, unenforced)
		}
		if newWarning {
			s.log.Warn("configuration served with warnings", "node", p.NodeID, "warnings", warnings)
			if s.opts.Recorder != nil && warned.on != nil {
				s.opts.Recorder.Eventf(warned.on, corev1.EventTypeWarning, ReasonConfigurationWarning,
					"configuration of %s/%s (node %s) served without: %s", p.Workload.Key.Namespace, p.Workload.Key.Name, p.NodeID, warnings)
			}
		}
		return snap, nil
	}
	keep, repeated := prev.snap, prev.lastErr == err.Error()
	prev.lastErr = err.Error()
	s.mu.Unlock()

	if m != nil {
		m.errors.WithLabelValues(reason).Inc()
	}
	if !repeated {
		s.log.Warn("configuration not translated; the proxy keeps its previous one", "node", p.NodeID, "reason", reason, "error", err)
		if s.opts.Recorder != nil && blame != nil {
			s.opts.Recorder.Eventf(blame, corev1.EventTypeWarning, ReasonInvalidConfiguration,
				"configuration of %s/%s (node %s) not updated, it keeps its previous one: %v", p.Workload.Key.Namespace, p.Workload.Key.Name, p.NodeID, err)
		}
	}
	if keep == nil {
		return emptySnapshot()
	}
	return keep, nil
}

// reportEnforcement tells the registry which policies selecting the
// workload are not enforced and, when there are any, records a
// ConfigurationWarning Event on its registration naming them.
func (s *Source) reportEnforcement(p *xds.Proxy, list []string, joined string) {
	if s.opts.Enforcement != nil {
		s.opts.Enforcement.Set(p.Workload.Key, list)
	}
	if joined == "" {
		return
	}
	s.log.Warn("policies selecting the workload are not enforced; its inbound traffic is refused", "node", p.NodeID, "policies", joined)
	if s.opts.Recorder != nil && p.Registration != nil {
		s.opts.Recorder.Eventf(p.Registration, corev1.EventTypeWarning, ReasonConfigurationWarning,
			"inbound traffic of %s/%s (node %s) refused: not enforced in standalone mode: %s", p.Workload.Key.Namespace, p.Workload.Key.Name, p.NodeID, joined)
	}
}

// Forget drops what is remembered of a node (its last good configuration);
// the xDS server calls it when the node's last stream closes.
func (s *Source) Forget(nodeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.served, nodeID)
	delete(s.workloads, nodeID)
	delete(s.owns, nodeID)
}

// workloadOf is a node's workload labels and service account, read from
// the registration the proxy is bound to (registry.BuildWorkloadEntry, which
// decodes the registration's WorkloadGroup snapshot: the dearest step of a
// proxy's configuration when done per push).
type workloadOf struct {
	// reg is the registration object they were read from: the proxy's
	// Registration, an object nobody modifies, so while the proxy holds the
	// same one they are the same.
	reg    *runtimev1alpha1.WorkloadAutoRegistration
	labels map[string]string
	sa     string
	err    error
}

// workloadOf returns p's workload labels and service account, read once per
// registration object the proxy holds. The labels are shared: do not modify
// them.
func (s *Source) workloadOf(p *xds.Proxy) *workloadOf {
	s.mu.Lock()
	w := s.workloads[p.NodeID]
	s.mu.Unlock()
	if w != nil && w.reg == p.Registration {
		return w
	}
	w = &workloadOf{reg: p.Registration}
	if we, err := registry.BuildWorkloadEntry(p.Registration); err != nil {
		w.err = err
	} else {
		w.labels, w.sa = we.Spec.Labels, we.Spec.ServiceAccount
	}
	s.mu.Lock()
	s.workloads[p.NodeID] = w
	s.mu.Unlock()
	return w
}

// warned is what a served configuration leaves out, and the object to
// tell it on.
type warned struct {
	warnings []string
	on       runtime.Object
	// unenforced names the policies selecting the workload that are not
	// enforced (translate.Result.Unenforced).
	unenforced []string
}

// compute reads the proxy's inputs, translates and validates them. The
// translation of the proxy's scope (translate.ScopeKey) is shared with every
// other proxy of the scope until the inputs change; only the proxy's own
// resources (its ingress listeners and inbound clusters) are built, validated
// and hashed per proxy. On error it says which object to blame (nil: none)
// and why.
func (s *Source) compute(ctx context.Context, p *xds.Proxy) (snap cache.ResourceSnapshot, w warned, blame runtime.Object, reason string, err error) {
	in, err := s.scopeInputs(ctx, p)
	if err != nil {
		return nil, w, nil, reasonInputs, err
	}
	sc, err := s.scopes.get(ctx, translate.ScopeKey(in), func() (*scopeTranslation, error) { return s.translateScope(ctx, in) })
	if err != nil {
		return nil, w, nil, reasonInputs, err
	}
	res, mine, err := s.own(p.NodeID, sc, in.Workload)
	if err != nil {
		return nil, w, blameFor(err, in, p), reasonSidecar, err
	}
	var subject runtime.Object = p.Registration
	if res.Sidecar != nil {
		subject = res.Sidecar
	}
	if sc.invalid != nil {
		return nil, w, subject, reasonValidation, sc.invalid
	}
	if mine.invalid != nil {
		return nil, w, subject, reasonValidation, mine.invalid
	}
	if mine.hashErr != nil {
		return nil, w, p.Registration, reasonValidation, mine.hashErr
	}
	if snap, err = sc.snapshot(mine); err != nil {
		return nil, w, subject, reasonValidation, err
	}
	var unenforced []string
	for _, u := range res.Unenforced {
		unenforced = append(unenforced, u.String())
	}
	return snap, warned{warnings: res.Warnings, on: subject, unenforced: unenforced}, nil, "", nil
}

// ownParts are a workload's own resources (translate.Shared.For's own),
// validated and hashed by type.
type ownParts struct {
	// inputs are what they were built from (translate.Shared.OwnInputs;
	// inputsOK: it was taken).
	inputs   translate.OwnInputs
	inputsOK bool

	// types are the resources of each of servedTypes, sorted by name,
	// with their digest (see digest).
	types [len(servedTypes)]ownType
	// invalid is why they do not validate; hashErr why they could not
	// be hashed (nil: they could).
	invalid, hashErr error
}

// ownType are a workload's own resources of one type.
type ownType struct {
	resources []types.Resource
	digest    []byte
	set       *snapcache.Set
}

// own returns the result of sc's translation for w and w's own resources:
// the node's last ones when neither the scope's inputs of them
// (translate.Shared.OwnInputs) nor the workload changed, else For's, checked
// and hashed and kept for the node's next configuration. A Sidecar change
// that leaves the ingress listeners alone thus costs each workload no
// translation, validation or hashing of its own.
func (s *Source) own(nodeID string, sc *scopeTranslation, w translate.Workload) (*translate.Result, *ownParts, error) {
	inputs, ok := sc.shared.OwnInputs(w)
	if common := sc.shared.Common(); ok && common != nil {
		s.mu.Lock()
		last := s.owns[nodeID]
		s.mu.Unlock()
		if last != nil && last.inputsOK && last.inputs.Equal(inputs) {
			if m := s.opts.Metrics; m != nil {
				m.ownReused.Inc()
			}
			return common, last, nil
		}
	}
	res, own, err := sc.shared.For(w)
	if err != nil {
		return nil, nil, err
	}
	parts := &ownParts{inputs: inputs, inputsOK: ok}
	if parts.invalid = own.Validate(); parts.invalid == nil {
		byType := own.ByType()
		for i, typ := range servedTypes {
			rs := byType[typ]
			d, err := digest(typ, rs, sc.parts)
			if err != nil {
				parts.hashErr = err
				break
			}
			parts.types[i] = ownType{resources: rs, digest: d, set: snapcache.NewSet(typ, rs)}
		}
	}
	s.mu.Lock()
	s.owns[nodeID] = parts
	s.mu.Unlock()
	return res, parts, nil
}

// Inputs reads what translation needs for p from the cache. The objects are
// the cache's own (not copies: translation reads thousands of them per
// proxy and modifies none); callers must not modify them.
func (s *Source) Inputs(ctx context.Context, p *xds.Proxy) (*translate.Inputs, error) {
	in, err := s.scopeInputs(ctx, p)
	if err != nil {
		return nil, err
	}
	if err := s.meshInputs(ctx, in); err != nil {
		return nil, err
	}
	return in, nil
}

// scopeInputs reads the workload and the objects of its namespace and the
// root namespace that may select it: what translate.ScopeKey reads. Within
// one push (see withListed) each namespace is read from the cache once.
func (s *Source) scopeInputs(ctx context.Context, p *xds.Proxy) (*translate.Inputs, error) {
	we := s.workloadOf(p)
	if we.err != nil {
		return nil, we.err
	}
	ns := p.Workload.Key.Namespace
	objs, err := s.selecting(ctx, ns)
	if err != nil {
		return nil, err
	}
	return &translate.Inputs{
		Mesh: s.opts.Mesh,
		Workload: translate.Workload{
			Name: p.Workload.Key.Name, Namespace: ns, Address: p.IP,
			Labels: we.labels, ServiceAccount: we.sa,
		},
		RootNamespace:          s.opts.RootNamespace,
		Sidecars:               objs.sidecars,
		PeerAuthentications:    objs.peerAuthentications,
		AuthorizationPolicies:  objs.authorizationPolicies,
		RequestAuthentications: objs.requestAuthentications,
	}, nil
}

// selectingObjects are the objects of a workload's namespace and the root
// namespace that may select it. The slices are shared by every workload of
// the namespace within one push: read-only, clipped so an append copies.
type selectingObjects struct {
	sidecars               []*istionetworkingv1.Sidecar
	peerAuthentications    []*istiosecurityv1.PeerAuthentication
	authorizationPolicies  []*istiosecurityv1.AuthorizationPolicy
	requestAuthentications []*istiosecurityv1.RequestAuthentication
}

// listed memoizes selectingObjects by namespace for one push: the push's
// workloads of one namespace (often all of them) list it once, not once
// each. A push reads the cache as it is when the push starts; a change
// arriving meanwhile is in the next batch, which pushes again.
type listed struct {
	mu   sync.Mutex
	byNS map[string]*listedNamespace
}

type listedNamespace struct {
	once sync.Once
	objs *selectingObjects
	err  error
}

type listedKey struct{}

// withListed returns ctx carrying a memo of the namespaces' selecting
// objects, for the Snapshot calls of one push.
func withListed(ctx context.Context) context.Context {
	return context.WithValue(ctx, listedKey{}, &listed{byNS: map[string]*listedNamespace{}})
}

// selecting returns the selecting objects of namespace ns, from ctx's memo
// when it has one.
func (s *Source) selecting(ctx context.Context, ns string) (*selectingObjects, error) {
	memo, _ := ctx.Value(listedKey{}).(*listed)
	if memo == nil {
		return s.listSelecting(ctx, ns)
	}
	memo.mu.Lock()
	e := memo.byNS[ns]
	if e == nil {
		e = &listedNamespace{}
		memo.byNS[ns] = e
	}
	memo.mu.Unlock()
	e.once.Do(func() { e.objs, e.err = s.listSelecting(ctx, ns) })
	return e.objs, e.err
}

// listSelecting reads the selecting objects of ns and the root namespace
// from the cache (the cache's own objects, not copies).
func (s *Source) listSelecting(ctx context.Context, ns string) (*selectingObjects, error) {
	namespaces := []string{ns}
	if s.opts.RootNamespace != ns {
		namespaces = append(namespaces, s.opts.RootNamespace)
	}
	objs := &selectingObjects{}
	for _, n := range namespaces {
		l := &istionetworkingv1.SidecarList{}
		if err := s.opts.Cache.List(ctx, l, client.InNamespace(n), client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list Sidecars: %w", err)
		}
		objs.sidecars = append(objs.sidecars, l.Items...)
		pas := &istiosecurityv1.PeerAuthenticationList{}
		if err := s.opts.Cache.List(ctx, pas, client.InNamespace(n), client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list PeerAuthentications: %w", err)
		}
		objs.peerAuthentications = append(objs.peerAuthentications, pas.Items...)
		aps := &istiosecurityv1.AuthorizationPolicyList{}
		if err := s.opts.Cache.List(ctx, aps, client.InNamespace(n), client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list AuthorizationPolicies: %w", err)
		}
		objs.authorizationPolicies = append(objs.authorizationPolicies, aps.Items...)
		ras := &istiosecurityv1.RequestAuthenticationList{}
		if err := s.opts.Cache.List(ctx, ras, client.InNamespace(n), client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list RequestAuthentications: %w", err)
		}
		objs.requestAuthentications = append(objs.requestAuthentications, ras.Items...)
	}
	objs.sidecars = slices.Clip(objs.sidecars)
	objs.peerAuthentications = slices.Clip(objs.peerAuthentications)
	objs.authorizationPolicies = slices.Clip(objs.authorizationPolicies)
	objs.requestAuthentications = slices.Clip(objs.requestAuthentications)
	return objs, nil
}

// meshInputs adds to in the objects every workload reads alike: Services,
// EndpointSlices, ServiceEntries, WorkloadEntries and Pods of every
// namespace.
func (s *Source) meshInputs(ctx context.Context, in *translate.Inputs) error {
	if err := s.serviceInputs(ctx, in); err != nil {
		return err
	}
	return s.endpointInputs(ctx, in)
}

// serviceInputs adds to in the Services and ServiceEntries of every
// namespace.
func (s *Source) serviceInputs(ctx context.Context, in *translate.Inputs) error {
	services := &corev1.ServiceList{}
	if err := s.opts.Cache.List(ctx, services, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list Services: %w", err)
	}
	in.Services = pointers(services.Items)
	ses := &istionetworkingv1.ServiceEntryList{}
	if err := s.opts.Cache.List(ctx, ses, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list ServiceEntries: %w", err)
	}
	in.ServiceEntries = ses.Items
	return nil
}

// endpointInputs adds to in the objects endpoints.Index indexes:
// EndpointSlices, WorkloadEntries and Pods of every namespace.
func (s *Source) endpointInputs(ctx context.Context, in *translate.Inputs) error {
	slicesList := &discoveryv1.EndpointSliceList{}
	if err := s.opts.Cache.List(ctx, slicesList, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list EndpointSlices: %w", err)
	}
	in.EndpointSlices = pointers(slicesList.Items)
	wes := &istionetworkingv1.WorkloadEntryList{}
	if err := s.opts.Cache.List(ctx, wes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list WorkloadEntries: %w", err)
	}
	in.WorkloadEntries = wes.Items
	pods := &corev1.PodList{}
	if err := s.opts.Cache.List(ctx, pods, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list Pods: %w", err)
	}
	in.Pods = pointers(pods.Items)
	return nil
}

func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// versioned builds a snapshot whose every type's version is a hash of the
// type's resources (by name), so that an unchanged type keeps its version
// and is not sent again.
func versioned(byType map[resource.Type][]types.Resource) (*cache.Snapshot, error) {
	snap := &cache.Snapshot{}
	for t, rs := range byType {
		rs = slices.Clone(rs)
		sortByName(rs)
		d, err := digest(t, rs, nil)
		if err != nil {
			return nil, err
		}
		snap.Resources[cache.GetResponseType(t)] = cache.NewResources(hex.EncodeToString(d)[:16], rs)
	}
	return snap, nil
}

func sortByName(rs []types.Resource) {
	slices.SortFunc(rs, func(a, b types.Resource) int { return cmp.Compare(cache.GetResourceName(a), cache.GetResourceName(b)) })
}

// emptySnapshot is a valid configuration with nothing in it.
func emptySnapshot() (*cache.Snapshot, error) {
	return versioned(map[resource.Type][]types.Resource{
		resource.ListenerType: nil, resource.RouteType: nil, resource.ClusterType: nil, resource.EndpointType: nil,
	})
}

// blameFor is the object a translation error is reported on: the Sidecar
// it names, else the workload's registration.
func blameFor(err error, in *translate.Inputs, p *xds.Proxy) runtime.Object {
	if name := sidecarOf(err); name != "" {
		for _, sc := range in.Sidecars {
			if sc.Namespace+"/"+sc.Name == name {
				return sc
			}
		}
	}
	return p.Registration
}

// sidecarOf is the "<namespace>/<name>" of the Sidecar err blames, if any.
func sidecarOf(err error) string {
	var se *translate.SidecarError
	if errors.As(err, &se) {
		return se.Sidecar
	}
	return ""
}
