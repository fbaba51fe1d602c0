package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// ReasonOnboardingDenied is the reason of the Warning Event the Authorizer
// records on a WorkloadGroup when it denies a workload; the Event's message is
// Decision.Message.
const ReasonOnboardingDenied = "OnboardingDenied"

// DefaultEventInterval is how long the Authorizer holds back a repeat of an
// identical denial Event (same WorkloadGroup, same message), see
// WithEventInterval.
const DefaultEventInterval = 5 * time.Minute

// maxTrackedEvents bounds the Authorizer's memory of recent denial Events.
const maxTrackedEvents = 4096

var (
	// ErrWorkloadGroupNotFound says that the WorkloadGroup a workload asked
	// to join does not exist. The onboarding endpoint answers FailedPrecondition, as
	// Istio does.
	ErrWorkloadGroupNotFound = errors.New("WorkloadGroup not found")
	// ErrDenied says that no OnboardingPolicy allows the workload to join the
	// WorkloadGroup. Errors for which errors.Is(err, ErrDenied) holds are
	// *DeniedError values; the onboarding endpoint answers PermissionDenied
	// with their message.
	ErrDenied = errors.New("onboarding denied")
)

// DeniedError is the error Authorize returns for a denial. Its message is
// Decision.Message; errors.Is(err, ErrDenied) holds.
type DeniedError struct {
	Decision Decision
}

var _ error = (*DeniedError)(nil)

// Error returns the decision's operator-facing message.
func (e *DeniedError) Error() string { return e.Decision.Message() }

// Is makes errors.Is(err, ErrDenied) true.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// Option configures an Authorizer.
type Option func(*options)

type options struct {
	logger        *slog.Logger
	eventInterval time.Duration
	clock         clock.PassiveClock
	decisions     DecisionRecorder
}

// DecisionRecorder is told of every decision of Authorize (not of Precheck):
// what OnboardingPolicy status reports (package policystatus). Its methods
// must not block.
type DecisionRecorder interface {
	// Allowed: a rule of the policy namespace/policy allowed a workload.
	Allowed(namespace, policy string, at time.Time)
	// Denied: a workload was denied joining the WorkloadGroup namespace/group.
	Denied(namespace, group string, at time.Time)
}

// WithDecisionRecorder tells r of every decision. Default: none.
func WithDecisionRecorder(r DecisionRecorder) Option {
	return func(o *options) { o.decisions = r }
}

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithEventInterval sets how long an identical denial Event (same
// WorkloadGroup, same message) is held back after one was recorded.
// Default: DefaultEventInterval. Zero or less hands every denial to the
// recorder, leaving all aggregation to client-go's event correlator.
func WithEventInterval(d time.Duration) Option {
	return func(o *options) { o.eventInterval = d }
}

// WithClock sets the clock for WithEventInterval. Default: the real clock.
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) { o.clock = c }
}

// Authorizer decides onboarding requests from an informer-backed view of the
// cluster and reports denials as Events on the WorkloadGroup.
//
// Events: a denial is handed to the recorder as a Warning Event with reason
// OnboardingDenied on the WorkloadGroup, unless an identical one (same
// WorkloadGroup UID, same message) was handed over less than the event
// interval ago. A VM that retries every few seconds therefore costs one
// Event per interval, not one per attempt. The recorder should come from a
// k8s.io/client-go/tools/record EventBroadcaster, whose correlator adds its
// own protection: identical Events become one Event whose count is increased
// (a PATCH instead of a new object); from the 10th different message about
// one WorkloadGroup within 10 minutes on, they are combined into one Event
// showing the latest message; and a spam filter allows a burst of 25 Events
// per WorkloadGroup and source, then one every 5 minutes. Recording never
// blocks onboarding: the broadcaster drops Events when its queue is full.
// (The events.k8s.io recorder of k8s.io/client-go/tools/events is not used
// because it merges Events that differ only in their message into one
// series that keeps the first message, hiding other workloads' denials.)
//
// An Authorizer is safe for concurrent use.
type Authorizer struct {
	reader    client.Reader
	recorder  record.EventRecorder
	log       *slog.Logger
	interval  time.Duration
	clock     clock.PassiveClock
	decisions DecisionRecorder

	mu     sync.Mutex
	recent map[eventKey]time.Time

	// policyGen counts the OnboardingPolicy changes the informer reported
	// to its handlers since WatchPolicies; policyRV is the informer's last
	// resource version (set when the informer takes an event in, before
	// its store and handlers see it); watching is set once both are.
	policyGen atomic.Uint64
	policyRV  func() string
	watching  atomic.Bool
	// indexes holds, per namespace, the Index built at indexesVersion
	// (only while watching); another version empties it.
	idxMu          sync.RWMutex
	indexesVersion policyVersion
	indexes        map[string]*Index
}

// policyVersion says which OnboardingPolicy events an Index has seen: an
// Index is reused only while both parts are unchanged.
type policyVersion struct {
	gen uint64
	rv  string
}

type eventKey struct {
	namespace, name string
	uid             types.UID
	message         string
}

// NewAuthorizer returns an Authorizer that reads WorkloadGroups
// (istio.io/client-go networking/v1) and OnboardingPolicies through reader,
// typically the controller-runtime cache.Cache of the endpoint (its scheme
// must know both types), and records denial Events with recorder.
func NewAuthorizer(reader client.Reader, recorder record.EventRecorder, opts ...Option) (*Authorizer, error) {
	if reader == nil {
		return nil, errors.New("policy: NewAuthorizer: reader is nil")
	}
	if recorder == nil {
		return nil, errors.New("policy: NewAuthorizer: recorder is nil")
	}
	o := options{eventInterval: DefaultEventInterval}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.clock == nil {
		o.clock = clock.RealClock{}
	}
	return &Authorizer{
		reader:    reader,
		recorder:  recorder,
		log:       o.logger,
		interval:  o.eventInterval,
		clock:     o.clock,
		decisions: o.decisions,
		recent:    make(map[eventKey]time.Time),
		indexes:   make(map[string]*Index),
	}, nil
}

// WatchPolicies subscribes a to the OnboardingPolicy informer of informers
// (the cache the Authorizer reads from). From then on the Authorizer keeps
// each namespace's Index between requests and builds it again only after
// the informer reports a change of a policy, so that a request costs a
// lookup of the rules its identity could match instead of a copy of every
// policy of the namespace. Without it, every request lists the policies
// and indexes them anew (the same decisions, at the cost of a copy).
func (a *Authorizer) WatchPolicies(ctx context.Context, informers cache.Informers) error {
	inf, err := informers.GetInformer(ctx, &authorizationv1alpha1.OnboardingPolicy{})
	if err != nil {
		return fmt.Errorf("OnboardingPolicy informer: %w", err)
	}
	if v, ok := inf.(interface{ LastSyncResourceVersion() string }); ok {
		a.policyRV = v.LastSyncResourceVersion
	}
	changed := func() { a.policyGen.Add(1) }
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}); err != nil {
		return fmt.Errorf("OnboardingPolicy event handler: %w", err)
	}
	a.watching.Store(true)
	return nil
}

// Authorize decides whether the workload with the verified identity id may
// join the WorkloadGroup namespace/groupName, using the OnboardingPolicies of
// that namespace (see Evaluate).
//
// It returns the Decision and:
//   - nil when allowed;
//   - an error wrapping ErrWorkloadGroupNotFound when the WorkloadGroup does
//     not exist (the Decision is then empty);
//   - a *DeniedError (errors.Is(err, ErrDenied)) when denied, after
//     recording the OnboardingDenied Event on the WorkloadGroup;
//   - another wrapped error when the reader fails.
//
// Invalid workloadGroupSelectors are logged as warnings.
func (a *Authorizer) Authorize(ctx context.Context, namespace, groupName string, id runtimev1alpha1.WorkloadIdentity) (Decision, error) {
	wg, ix, err := a.load(ctx, namespace, groupName)
	if err != nil {
		return Decision{}, err
	}
	d := ix.Evaluate(GroupRefOf(wg), id)
	for _, s := range d.InvalidSelectors {
		a.log.WarnContext(ctx, "OnboardingPolicy has an invalid workloadGroupSelector, which selects nothing",
			"namespace", namespace, "policy", s.Policy, "rule", s.Rule, "onboardTo", s.Target, "error", s.Err)
	}
	if a.decisions != nil {
		if d.Allowed {
			a.decisions.Allowed(namespace, d.AllowedBy.Policy, a.clock.Now())
		} else {
			a.decisions.Denied(namespace, groupName, a.clock.Now())
		}
	}
	if d.Allowed {
		a.log.DebugContext(ctx, "onboarding allowed",
			"namespace", namespace, "workloadGroup", groupName, "identity", DescribeIdentity(id),
			"policy", d.AllowedBy.Policy, "rule", d.AllowedBy.Rule)
		return d, nil
	}
	msg := d.Message()
	a.log.InfoContext(ctx, "onboarding denied",
		"namespace", namespace, "workloadGroup", groupName, "identity", DescribeIdentity(id),
		"policies", d.Policies, "needsIAMRoleProof", d.NeedsIAMRoleProof, "message", msg)
	a.recordDenial(ctx, wg, msg)
	return d, &DeniedError{Decision: d}
}

// RequiresIAMRoleProof reports whether a rule of an OnboardingPolicy in the
// namespace that selects the WorkloadGroup names IAM roles (see the function
// RequiresIAMRoleProof). The endpoint asks an EC2 agent that sent no signed
// sts:GetCallerIdentity request for one when this is true, before calling
// Authorize, so that workloads that can prove their role are not first
// denied (and reported in an Event) for lack of proof. A missing
// WorkloadGroup gives an error wrapping ErrWorkloadGroupNotFound.
func (a *Authorizer) RequiresIAMRoleProof(ctx context.Context, namespace, groupName string) (bool, error) {
	wg, ix, err := a.load(ctx, namespace, groupName)
	if err != nil {
		return false, err
	}
	return ix.RequiresIAMRoleProof(GroupRefOf(wg)), nil
}

// AllowsAddress reports whether an OnboardingPolicy rule that allows id to
// join the WorkloadGroup lets it register addr, an address its identity does
// not prove (see AddressAllowed). It records no Event.
func (a *Authorizer) AllowsAddress(ctx context.Context, namespace, groupName string, id runtimev1alpha1.WorkloadIdentity, addr netip.Addr) (bool, error) {
	wg, ix, err := a.load(ctx, namespace, groupName)
	if err != nil {
		return false, err
	}
	return ix.AddressAllowed(GroupRefOf(wg), id, addr), nil
}

// Precheck evaluates the policies for id without recording an Event: the
// endpoint asks it with what the instance identity document proves, before
// it calls STS, so that identities no rule could allow never cost an STS
// call. The Decision is allowed, or denied with NeedsIAMRoleProof when a
// proof of the IAM role could still allow it (see Index.Precheck: such a
// denial carries no closest rules).
func (a *Authorizer) Precheck(ctx context.Context, namespace, groupName string, id runtimev1alpha1.WorkloadIdentity) (Decision, error) {
	wg, ix, err := a.load(ctx, namespace, groupName)
	if err != nil {
		return Decision{}, err
	}
	return ix.Precheck(GroupRefOf(wg), id), nil
}

// load reads the WorkloadGroup and the Index of the OnboardingPolicies of
// its namespace.
func (a *Authorizer) load(ctx context.Context, namespace, groupName string) (*networkingv1.WorkloadGroup, *Index, error) {
	wg := &networkingv1.WorkloadGroup{}
	if err := a.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: groupName}, wg); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("%w: %s/%s", ErrWorkloadGroupNotFound, namespace, groupName)
		}
		return nil, nil, fmt.Errorf("get WorkloadGroup %s/%s: %w", namespace, groupName, err)
	}
	ix, err := a.index(ctx, namespace)
	if err != nil {
		return nil, nil, err
	}
	return wg, ix, nil
}

// index returns the Index of the namespace's OnboardingPolicies: the one
// kept since the informer last took a policy event in, when WatchPolicies
// subscribed to it, or one built from a fresh list. The version is read
// before the list, so that an event the list may miss builds it again: an
// event changes the informer's resource version before its store sees it,
// and bumps the handlers' count after.
func (a *Authorizer) index(ctx context.Context, namespace string) (*Index, error) {
	watching := a.watching.Load()
	var ver policyVersion
	if watching {
		if a.policyRV != nil {
			ver.rv = a.policyRV()
		}
		ver.gen = a.policyGen.Load()
		a.idxMu.RLock()
		ix, ok := a.indexes[namespace]
		current := a.indexesVersion == ver
		a.idxMu.RUnlock()
		if ok && current {
			return ix, nil
		}
	}
	var list authorizationv1alpha1.OnboardingPolicyList
	if err := a.reader.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list OnboardingPolicies in namespace %s: %w", namespace, err)
	}
	ix := NewIndex(list.Items, namespace)
	if watching {
		a.keep(namespace, ver, ix)
	}
	return ix, nil
}

// keep stores ix, built at version ver. Indexes of another version are
// forgotten, unless theirs has seen more handler events (ix is then the
// older one and is not kept).
func (a *Authorizer) keep(namespace string, ver policyVersion, ix *Index) {
	a.idxMu.Lock()
	defer a.idxMu.Unlock()
	switch {
	case ver.gen < a.indexesVersion.gen:
		return
	case ver != a.indexesVersion:
		clear(a.indexes)
		a.indexesVersion = ver
	}
	a.indexes[namespace] = ix
}

// recordDenial hands the denial Event to the recorder unless an identical
// one was handed over within the event interval.
func (a *Authorizer) recordDenial(ctx context.Context, wg *networkingv1.WorkloadGroup, msg string) {
	if !a.shouldRecord(eventKey{namespace: wg.Namespace, name: wg.Name, uid: wg.UID, message: msg}) {
		a.log.DebugContext(ctx, "denial Event held back: an identical one was recorded recently",
			"namespace", wg.Namespace, "workloadGroup", wg.Name, "interval", a.interval)
		return
	}
	// Called without holding a.mu: the recorder is outside code.
	a.recorder.Event(wg, corev1.EventTypeWarning, ReasonOnboardingDenied, msg)
}

func (a *Authorizer) shouldRecord(k eventKey) bool {
	if a.interval <= 0 {
		return true
	}
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.recent[k]; ok && now.Sub(last) < a.interval {
		return false
	}
	if len(a.recent) >= maxTrackedEvents {
		a.pruneLocked(now)
	}
	a.recent[k] = now
	return true
}

// pruneLocked forgets expired entries and, if that is not enough, arbitrary
// ones, so that the map stays below maxTrackedEvents. Forgetting an entry
// early only lets one more Event through to client-go's correlator.
func (a *Authorizer) pruneLocked(now time.Time) {
	for k, t := range a.recent {
		if now.Sub(t) >= a.interval {
			delete(a.recent, k)
		}
	}
	for k := range a.recent {
		if len(a.recent) < maxTrackedEvents {
			break
		}
		delete(a.recent, k)
	}
}
