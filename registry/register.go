package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry/write"
)

// Errors Write returns; the onboarding endpoint maps them to gRPC codes.
var (
	// ErrInvalidRegistration: what the workload reported is not acceptable.
	ErrInvalidRegistration = errors.New("invalid registration")
	// ErrIdentityConflict: a registration of that name holds another identity.
	ErrIdentityConflict = errors.New("registration name held by another identity")
	// ErrAddressConflict: the address is held by a WorkloadEntry Embark does
	// not manage or (for an address the workload's identity does not prove)
	// by another registration of the same namespace.
	ErrAddressConflict = errors.New("address held by another WorkloadEntry")
	// ErrSessionMismatch: the registration exists and is bound to another
	// agent session, and the request carries no proof strong enough to take
	// it over (Request.Takeover).
	ErrSessionMismatch = errors.New("registration is bound to another agent session")
)

// Event reasons the registrar records.
const (
	ReasonRegistered = "Registered"
	ReasonFenced     = "Fenced"
)

// Reasons of the Fenced condition.
const (
	// ReasonAddressReused (Fenced=True): another registration now holds
	// this one's address; its WorkloadEntry was removed.
	ReasonAddressReused = "AddressReused"
	// ReasonAddressReclaimed (Fenced=False): the workload registered again
	// with its address.
	ReasonAddressReclaimed = "AddressReclaimed"
)

// AddressIndex is the cache index of WorkloadEntries by network and address.
const AddressIndex = "embark.spec.networkAddress"

// Options configures a Registrar. Every field documents its default.
type Options struct {
	// Client writes registrations and WorkloadEntries (and reads them when a
	// write needs the current object). Required.
	Client client.Client
	// Cache is an informer-backed reader with the indexes of SetupIndexes,
	// used to find WorkloadEntries holding an address. Required.
	Cache client.Reader
	// Recorder records Events on registrations. Default: none recorded.
	Recorder record.EventRecorder
	// Logger. Default: slog.Default().
	Logger *slog.Logger
	// Writer is the replica's write budget, shared with every component
	// that writes (write.Writer). Default: a Writer of its own with
	// write.Options' defaults.
	Writer *write.Writer
	// Clock. Default: time.Now.
	Clock func() time.Time
	// Sidecar configures the sidecar's token. Default: see
	// SidecarCredentialOptions.
	Sidecar SidecarCredentialOptions
	// Revision is the Istio revision of the istiod beside Embark ("" or
	// "default": none). Registrations and their WorkloadEntries record it
	// as AnnotationIstioRevision; the entries never carry istio.io/rev, so
	// every revision's istiod takes them.
	Revision string
	// RevisionOf, when set, chooses each registration's revision from its
	// WorkloadGroup (and the group's namespace) in place of Revision: an
	// Embark serving several istiod revisions. Default: Revision for all.
	RevisionOf func(ctx context.Context, group *istionetworkingv1.WorkloadGroup) string
	// Topology is the mesh's networks; each registration's network is
	// checked against it (the NetworkTopology condition, CheckTopology).
	// Default: none, only a group contradicting itself is reported.
	Topology *Topology
}

// Registrar creates and updates WorkloadAutoRegistrations and their
// WorkloadEntries. It is safe for concurrent use, also by several replicas.
type Registrar struct {
	client   client.Client
	cache    client.Reader
	recorder record.EventRecorder
	log      *slog.Logger
	writer   *write.Writer
	now      func() time.Time
	sidecar  SidecarCredentialOptions
	revision string
	// revisionOf chooses a group's revision; nil: revision for all.
	revisionOf func(ctx context.Context, group *istionetworkingv1.WorkloadGroup) string
	topology   *Topology
}

// NewRegistrar returns a Registrar.
func NewRegistrar(opts Options) (*Registrar, error) {
	if opts.Client == nil || opts.Cache == nil {
		return nil, errors.New("registry: Client and Cache are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Recorder == nil {
		opts.Recorder = NoEvents{}
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	opts.Sidecar.setDefaults()
	return &Registrar{
		client:     opts.Client,
		cache:      opts.Cache,
		recorder:   opts.Recorder,
		log:        opts.Logger,
		writer:     write.OrDefault(opts.Writer),
		now:        opts.Clock,
		sidecar:    opts.Sidecar,
		revision:   revisionOf(opts.Revision),
		revisionOf: opts.RevisionOf,
		topology:   opts.Topology,
	}, nil
}

// IndexFields is the field indexer a cache offers (controller-runtime's
// cache.Cache and manager.Manager's FieldIndexer satisfy it).
type IndexFields interface {
	IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error
}

// SetupIndexes adds the indexes the Registrar's cache needs. Call it before
// the cache starts.
func SetupIndexes(ctx context.Context, indexer IndexFields) error {
	err := indexer.IndexField(ctx, &istionetworkingv1.WorkloadEntry{}, AddressIndex, func(obj client.Object) []string {
		we, ok := obj.(*istionetworkingv1.WorkloadEntry)
		if !ok || we.Spec.Address == "" {
			return nil
		}
		return []string{AddressKey(we.Spec.Network, we.Spec.Address)}
	})
	if err != nil {
		return fmt.Errorf("index WorkloadEntries by address: %w", err)
	}
	return nil
}

// AddressKey is the AddressIndex value of a WorkloadEntry address on a network.
func AddressKey(network, address string) string { return network + "/" + address }

// Request is one workload's registration.
type Request struct {
	// Group is the WorkloadGroup the workload joins, as authorized; it is
	// snapshotted into a new registration.
	Group *istionetworkingv1.WorkloadGroup
	// Identity is the verified identity.
	Identity runtimev1alpha1.WorkloadIdentity
	// Registration is what the workload reported.
	Registration runtimev1alpha1.Registration
	// SessionHash is the hex SHA-256 of the agent's session key (see
	// AnnotationSessionHash). A new registration is bound to it; an existing
	// one is reused only when it is bound to the same hash, or when Takeover
	// is set (it is then bound to SessionHash). Empty: not checked (tests
	// and callers that bind no session).
	SessionHash string
	// Takeover says the identity carries a fresh proof (an STS proof of the
	// instance's role session, or a JWT) that may take an existing
	// registration over from another session. A bare instance identity
	// document never does.
	Takeover bool
	// AddressProven says the workload address is proven by the identity
	// (an EC2 document's signed privateIp). Only a proven address fences
	// older registrations holding it; an unproven one held by another
	// registration is refused with ErrAddressConflict.
	AddressProven bool
	// AgentError is the agent's last failed onboarding attempt as it
	// reported it; nil when it reported none. It is written, with the
	// agent's version, to status.agent for operators and decides nothing.
	AgentError *runtimev1alpha1.AgentError
}

// AnnotationSessionHash holds, on a WorkloadAutoRegistration, the hex SHA-256
// of the session key of the agent bound to it.
const AnnotationSessionHash = "onboarding.tetrate.io/session-sha256"

// Result is a registration as stored.
type Result struct {
	Registration  *runtimev1alpha1.WorkloadAutoRegistration
	WorkloadEntry *istionetworkingv1.WorkloadEntry
	// Created is true when this call created the registration.
	Created bool
	// SidecarToken is a fresh token for the workload's sidecar, bound to
	// the registration's Secret.
	SidecarToken *SidecarToken
}

// Write creates the workload's WorkloadAutoRegistration (named by
// RegistrationName, owned by the WorkloadGroup, holding the identity, registration and a
// snapshot of the group) and its WorkloadEntry (owned by the registration).
// Writing the same workload again reuses the registration, keeps its
// snapshot and updates what the workload reported. Once the registration
// exists, its WorkloadEntry and its sidecar credential (Secret, then token)
// are written at once (writeDependents), and beside them a new
// registration's status (writeNewStatus). A new registration of which either
// cannot be written is removed again with what it owns, so a failure leaves
// no half-made registration; a reused one is repaired by the next call.
//
// When another registration's WorkloadEntry holds the same address on the
// same network, that older registration is fenced: its WorkloadEntry is
// removed, and a Fenced condition and an Event say why.
//
// It also creates the registration's sidecar credential Secret (owned by the
// registration) and returns a token of the WorkloadGroup's service account
// bound to it; a missing service account fails with ErrServiceAccountMissing
// before anything is written.
func (r *Registrar) Write(ctx context.Context, req Request) (*Result, error) {
	if errs := ValidateRegistration(req.Registration, req.Group); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRegistration, errs.ToAggregate())
	}
	name := Name(req.Group.Name, req.Identity)
	if name == "" {
		return nil, fmt.Errorf("%w: no verified identity", ErrInvalidRegistration)
	}
	snap, err := Snapshot(req.Group)
	if err != nil {
		return nil, err
	}
	if err := r.checkServiceAccount(ctx, r.sidecarServiceAccount(ctx, req.Group, name)); err != nil {
		return nil, err
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   req.Group.Namespace,
			Annotations: r.registrationAnnotations(req.SessionHash, r.groupRevision(ctx, req.Group)),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: istionetworkingv1.SchemeGroupVersion.String(),
				Kind:       "WorkloadGroup",
				Name:       req.Group.Name,
				UID:        req.Group.UID,
				Controller: ptr.To(true),
			}},
		},
		Spec: runtimev1alpha1.WorkloadAutoRegistrationSpec{
			Identity:      req.Identity,
			Registration:  req.Registration,
			WorkloadGroup: snap,
		},
	}
	log := r.log.With("namespace", war.Namespace, "registration", war.Name)

	created := false
	err = r.writer.Do(ctx, func(ctx context.Context) error {
		return r.client.Create(ctx, war)
	})
	switch {
	case err == nil:
		created = true
	case apierrors.IsAlreadyExists(err):
		war, err = r.reuse(ctx, war, req)
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("create WorkloadAutoRegistration %s/%s: %w", war.Namespace, war.Name, err)
	}

	// A new registration's status (its NetworkTopology condition and the
	// agent's report) is written while its dependents are, in one update
	// of the registration as created: the status is not on the critical
	// path, and costs one write, not two.
	var status <-chan *runtimev1alpha1.WorkloadAutoRegistration
	if created {
		status = r.writeNewStatus(ctx, war.DeepCopy(), req.Registration.Agent.Version, req.AgentError)
	}
	we, tok, err := r.writeDependents(ctx, war, req.AddressProven)
	if created {
		if written := <-status; written != nil {
			war.Status, war.ResourceVersion = written.Status, written.ResourceVersion
		}
	}
	if err != nil {
		if created {
			r.rollback(ctx, war, log)
		}
		return nil, err
	}
	if !created {
		r.checkTopology(ctx, war, we.Spec.Address)
		r.recordAgent(ctx, war, req.Registration.Agent.Version, req.AgentError)
	}
	if created {
		log.Info("registered workload", "group", req.Group.Name, "address", we.Spec.Address)
		r.recorder.Eventf(war, corev1.EventTypeNormal, ReasonRegistered, "Registered workload %s at %s in WorkloadGroup %s", IdentityName(req.Identity), we.Spec.Address, req.Group.Name)
	}
	return &Result{Registration: war, WorkloadEntry: we, Created: created, SidecarToken: tok}, nil
}

// writeDependents writes what the registration owns: its WorkloadEntry, and
// its sidecar Secret then a token bound to it. The two branches depend only
// on the registration, so they run at once (the critical path of a Register
// is three API round trips, not four); each write still goes through the
// write budget. It returns once both branches have ended: when one fails,
// the other is cancelled and waited for, so that the caller's clean-up
// runs after every write of this call.
func (r *Registrar) writeDependents(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, proven bool) (*istionetworkingv1.WorkloadEntry, *SidecarToken, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		we     *istionetworkingv1.WorkloadEntry
		weErr  error
		wg     sync.WaitGroup
		failed = func(err error) error {
			if err != nil {
				cancel(err)
			}
			return err
		}
	)
	wg.Go(func() {
		we, weErr = r.ensureWorkloadEntry(ctx, war, proven)
		weErr = failed(weErr)
	})
	tok, tokErr := func() (*SidecarToken, error) {
		secret, err := r.ensureSidecarSecret(ctx, war)
		if err != nil {
			return nil, failed(err)
		}
		tok, err := r.requestSidecarToken(ctx, war, secret)
		return tok, failed(err)
	}()
	wg.Wait()
	// The first failure is the cause; the other branch's is its
	// cancellation.
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return nil, nil, cause
	}
	if err := errors.Join(weErr, tokErr); err != nil {
		return nil, nil, err
	}
	return we, tok, nil
}

// reuse updates an existing registration of the same identity with what the
// workload reported now. Its snapshot is kept.
func (r *Registrar) reuse(ctx context.Context, want *runtimev1alpha1.WorkloadAutoRegistration, req Request) (*runtimev1alpha1.WorkloadAutoRegistration, error) {
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
			return err
		}
		// Another workload under the name (a collision of shortened
		// names) is refused. The same workload proven with other details
		// (a check turned on that confirms it and proves its address, an
		// STS proof of its role this time, a location) keeps its
		// registration, which then holds what was proven last.
		if !SameWorkload(cur.Spec.Identity, want.Spec.Identity) {
			return fmt.Errorf("%w: %s/%s", ErrIdentityConflict, cur.Namespace, cur.Name)
		}
		if cur.DeletionTimestamp != nil {
			return apierrors.NewConflict(runtimev1alpha1.Resource("workloadautoregistrations"), cur.Name, errors.New("the registration is being deleted"))
		}
		rekey := false
		if req.SessionHash != "" && cur.Annotations[AnnotationSessionHash] != req.SessionHash {
			if !req.Takeover {
				return fmt.Errorf("%w: %s/%s", ErrSessionMismatch, cur.Namespace, cur.Name)
			}
			rekey = true
		}
		rev := want.Annotations[AnnotationIstioRevision]
		revised := cur.Annotations[AnnotationIstioRevision] != rev
		reproven := !reflect.DeepEqual(cur.Spec.Identity, want.Spec.Identity)
		if !rekey && !revised && !reproven && reflect.DeepEqual(cur.Spec.Registration, want.Spec.Registration) {
			return nil
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		if rekey {
			cur.Annotations[AnnotationSessionHash] = req.SessionHash
		}
		if revised {
			setOrDelete(cur.Annotations, AnnotationIstioRevision, rev)
		}
		cur.Spec.Identity = want.Spec.Identity
		cur.Spec.Registration = want.Spec.Registration
		return r.client.Update(ctx, cur)
	})
	if err != nil {
		return nil, fmt.Errorf("update WorkloadAutoRegistration %s/%s: %w", want.Namespace, want.Name, err)
	}
	return cur, nil
}

// registrationAnnotations are a new registration's annotations: the agent
// session's key hash and the Istio revision rev.
func (r *Registrar) registrationAnnotations(hash, rev string) map[string]string {
	out := map[string]string{}
	setOrDelete(out, AnnotationSessionHash, hash)
	setOrDelete(out, AnnotationIstioRevision, rev)
	if len(out) == 0 {
		return nil
	}
	return out
}

// groupRevision is the Istio revision of group's workloads: RevisionOf's
// choice when set, else Revision ("" for the default revision).
func (r *Registrar) groupRevision(ctx context.Context, group *istionetworkingv1.WorkloadGroup) string {
	if r.revisionOf == nil {
		return r.revision
	}
	return revisionOf(r.revisionOf(ctx, group))
}

// setOrDelete sets m[k] = v, or deletes k when v is empty.
func setOrDelete(m map[string]string, k, v string) {
	if v == "" {
		delete(m, k)
		return
	}
	m[k] = v
}

// revisionOf is the revision an istio.io/rev label names: none for "" and
// Istio's "default".
func revisionOf(rev string) string {
	if rev == "default" {
		return ""
	}
	return rev
}

// ensureWorkloadEntry creates or updates the registration's WorkloadEntry,
// fencing older registrations that hold its address.
func (r *Registrar) ensureWorkloadEntry(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, proven bool) (*istionetworkingv1.WorkloadEntry, error) {
	want, err := BuildWorkloadEntry(war)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRegistration, err)
	}
	if err := r.fenceAddressHolders(ctx, war, want, proven); err != nil {
		return nil, err
	}
	var we *istionetworkingv1.WorkloadEntry
	err = r.writer.Do(ctx, func(ctx context.Context) error {
		we = want.DeepCopy()
		err := r.client.Create(ctx, we)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		cur := &istionetworkingv1.WorkloadEntry{}
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
			return err
		}
		if ref, ok := OwnedBy(cur.OwnerReferences, war.Name); !ok || ref.UID != war.UID {
			// Left behind by an earlier registration of the same name that
			// the garbage collector has not removed yet: try again later.
			return apierrors.NewConflict(istionetworkingv1.Resource("workloadentries"), cur.Name, errors.New("owned by an earlier registration"))
		}
		if workloadEntryUpToDate(cur, want) || builtFromNewer(cur, war) {
			// Up to date, or written from a newer version of the
			// registration by a concurrent register: never go back.
			we = cur
			return nil
		}
		cur.Labels = want.Labels
		cur.Annotations = WithoutIstiodAnnotations(mergeAnnotations(cur.Annotations, want.Annotations))
		if _, ok := want.Annotations[AnnotationIstioRevision]; !ok {
			delete(cur.Annotations, AnnotationIstioRevision) // a revision recorded earlier; the unnamed default has none
		}
		cur.Spec.Address = want.Spec.Address
		cur.Spec.Labels = want.Spec.Labels
		cur.Spec.Ports = want.Spec.Ports
		cur.Spec.Network = want.Spec.Network
		cur.Spec.Locality = want.Spec.Locality
		cur.Spec.Weight = want.Spec.Weight
		cur.Spec.ServiceAccount = want.Spec.ServiceAccount
		we = cur
		return r.client.Update(ctx, cur)
	})
	if err != nil {
		return nil, fmt.Errorf("write WorkloadEntry %s/%s: %w", want.Namespace, want.Name, err)
	}
	if cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionFenced); cond != nil && cond.Status == metav1.ConditionTrue {
		r.setFenced(ctx, war, metav1.ConditionFalse, ReasonAddressReclaimed, fmt.Sprintf("registered again with address %s", want.Spec.Address))
	}
	return we, nil
}

// builtFromNewer reports whether cur was built from a later generation of the
// registration than war.
func builtFromNewer(cur *istionetworkingv1.WorkloadEntry, war *runtimev1alpha1.WorkloadAutoRegistration) bool {
	gen, err := strconv.ParseInt(cur.Annotations[AnnotationRegistrationGeneration], 10, 64)
	return err == nil && gen > war.Generation
}

func workloadEntryUpToDate(cur, want *istionetworkingv1.WorkloadEntry) bool {
	if HasIstiodAnnotations(cur.Annotations) {
		return false // migrate: an earlier version wrote istiod's annotations
	}
	for k, v := range want.Annotations {
		if cur.Annotations[k] != v {
			return false
		}
	}
	if _, ok := want.Annotations[AnnotationIstioRevision]; !ok && cur.Annotations[AnnotationIstioRevision] != "" {
		return false
	}
	return reflect.DeepEqual(cur.Labels, want.Labels) &&
		cur.Spec.Address == want.Spec.Address &&
		reflect.DeepEqual(cur.Spec.Labels, want.Spec.Labels) &&
		reflect.DeepEqual(cur.Spec.Ports, want.Spec.Ports) &&
		cur.Spec.Network == want.Spec.Network &&
		cur.Spec.Locality == want.Spec.Locality &&
		cur.Spec.Weight == want.Spec.Weight &&
		cur.Spec.ServiceAccount == want.Spec.ServiceAccount
}

func mergeAnnotations(cur, want map[string]string) map[string]string {
	out := make(map[string]string, len(cur)+len(want))
	for k, v := range cur {
		out[k] = v
	}
	for k, v := range want {
		out[k] = v
	}
	return out
}

// fenceAddressHolders removes the WorkloadEntries of other registrations that
// hold want's address on want's network, so that no two live WorkloadEntries
// share an address (an IP reused by a new VM while the old registration is
// still in its grace period). Only a proven address fences, and only within
// the registration's own namespace: a holder in another namespace is left
// alone (logged), and a WorkloadEntry that Embark does not manage or any
// same-namespace holder of an unproven address is never touched: the
// registration is refused instead (ErrAddressConflict).
func (r *Registrar) fenceAddressHolders(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, want *istionetworkingv1.WorkloadEntry, proven bool) error {
	holders := &istionetworkingv1.WorkloadEntryList{}
	if err := r.cache.List(ctx, holders, client.MatchingFields{AddressIndex: AddressKey(want.Spec.Network, want.Spec.Address)}); err != nil {
		return fmt.Errorf("find WorkloadEntries holding %s: %w", want.Spec.Address, err)
	}
	for _, holder := range holders.Items {
		if holder.Namespace == want.Namespace && holder.Name == want.Name {
			continue
		}
		ref, managed := OwnedBy(holder.OwnerReferences, "")
		switch {
		case !managed:
			return fmt.Errorf("%w: WorkloadEntry %s/%s, not managed by Embark, holds %s on network %q", ErrAddressConflict, holder.Namespace, holder.Name, want.Spec.Address, want.Spec.Network)
		case holder.Namespace != want.Namespace:
			// Never across namespaces: a workload allowed in one namespace
			// must not evict (nor block) another namespace's workload.
			r.log.Warn("another namespace's WorkloadEntry holds the same address; not fenced", "holder", holder.Namespace+"/"+holder.Name, "registration", war.Namespace+"/"+war.Name, "address", want.Spec.Address, "network", want.Spec.Network)
			continue
		case !proven:
			return fmt.Errorf("%w: WorkloadEntry %s/%s holds %s on network %q, and an address the identity does not prove never fences another registration", ErrAddressConflict, holder.Namespace, holder.Name, want.Spec.Address, want.Spec.Network)
		}
		// Delete exactly the entry we saw; a newer one of the same name is not ours to remove.
		err := r.writer.Do(ctx, func(ctx context.Context) error {
			return r.client.Delete(ctx, holder, client.Preconditions{UID: &holder.UID})
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("fence WorkloadEntry %s/%s holding %s: %w", holder.Namespace, holder.Name, want.Spec.Address, err)
		}
		older := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := r.client.Get(ctx, types.NamespacedName{Namespace: holder.Namespace, Name: ref.Name}, older); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("read fenced registration %s/%s: %w", holder.Namespace, ref.Name, err)
		}
		msg := fmt.Sprintf("address %s on network %q is now held by %s/%s; this registration's WorkloadEntry was removed", want.Spec.Address, want.Spec.Network, war.Namespace, war.Name)
		r.log.Warn("fenced registration holding a reused address", "fenced", older.Namespace+"/"+older.Name, "by", war.Namespace+"/"+war.Name, "address", want.Spec.Address)
		r.recorder.Event(older, corev1.EventTypeWarning, ReasonFenced, msg)
		r.setFenced(ctx, older, metav1.ConditionTrue, ReasonAddressReused, msg)
	}
	return nil
}

// setFenced writes the Fenced condition when it changes. Failing to write it
// is logged, not returned: the Event and the removed WorkloadEntry already
// tell the story, and the condition is informational.
func (r *Registrar) setFenced(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, status metav1.ConditionStatus, reason, msg string) {
	key := client.ObjectKeyFromObject(war)
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		cur := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := r.client.Get(ctx, key, cur); err != nil {
			return err
		}
		changed := meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{
			Type: runtimev1alpha1.ConditionFenced, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: cur.Generation, LastTransitionTime: metav1.NewTime(r.now()),
		})
		if !changed {
			return nil
		}
		return r.client.Status().Update(ctx, cur)
	})
	if err != nil && !apierrors.IsNotFound(err) {
		r.log.Error("write Fenced condition", "registration", key.String(), "error", err)
	}
}

// rollback deletes a registration this call created when its WorkloadEntry
// could not be written.
func (r *Registrar) rollback(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, log *slog.Logger) {
	// The caller's context may be what failed; finish the cleanup regardless.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		err := r.client.Delete(ctx, war, client.Preconditions{UID: &war.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		log.Error("remove half-made registration; the next register repairs it", "error", err)
		return
	}
	log.Info("removed registration whose WorkloadEntry could not be written")
}

// rawExtension wraps JSON in a RawExtension.
func rawExtension(raw []byte) runtime.RawExtension { return runtime.RawExtension{Raw: raw} }
