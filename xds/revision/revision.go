package revision

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/xds"
)

// Labels Istio chooses a control-plane revision by.
const (
	// LabelRevision names a revision on a namespace or a workload.
	LabelRevision = registry.LabelRevision
	// LabelInjection=enabled on a namespace selects the default revision,
	// whatever else it carries.
	LabelInjection = "istio-injection"
	// Default is the name of the default revision (istiod without
	// REVISION); the Selector returns it as "".
	Default = "default"
)

// ReasonUnknownIstioRevision (Warning Event on a registration): its
// namespace or group names a revision this Embark has no istiod for; the
// default revision serves it.
const ReasonUnknownIstioRevision = "UnknownIstioRevision"

// ReasonIstioRevisionChanged (Normal Event on a registration): its sidecar's
// stream moved to another istiod revision.
const ReasonIstioRevisionChanged = "IstioRevisionChanged"

// Choose returns the revision named for a workload of a namespace labelled
// nsLabels and a WorkloadGroup labelled groupLabels, as Istio's injection
// webhooks choose a pod's (istio-discovery's mutatingwebhook.yaml): a
// namespace with istio-injection=enabled gets the default revision; else a
// namespace's istio.io/rev wins; the group's istio.io/rev counts only in a
// namespace with neither label. "" and "default" are the default revision,
// returned as "".
func Choose(nsLabels, groupLabels map[string]string) string {
	if _, ok := nsLabels[LabelInjection]; ok {
		return "" // enabled: default; disabled: not injected, Embark serves it with the default
	}
	if rev, ok := nsLabels[LabelRevision]; ok {
		return Normal(rev)
	}
	return Normal(groupLabels[LabelRevision])
}

// Normal maps Istio's "default" revision to "".
func Normal(rev string) string {
	if rev == Default {
		return ""
	}
	return rev
}

// Options configures a Selector. Every field documents its default.
type Options struct {
	// Reader reads Namespaces, WorkloadGroups and registrations (the
	// informer cache). Required.
	Reader client.Reader
	// Client writes a moved registration's annotation and its
	// WorkloadEntry's. Required.
	Client client.Client
	// Revisions are the revisions with an istiod besides the default one.
	// Default: none (every workload is served by the default revision).
	Revisions []string
	// Default is the default revision's own name (istiod.revision), which
	// names it as "" and "default" do; registrations and WorkloadEntries of
	// the default revision record it. Default: "" (none).
	Default string
	// Writer is the replica's write budget. Default: a Writer of its own.
	Writer *write.Writer
	// Recorder records UnknownIstioRevision and IstioRevisionChanged
	// Events on registrations. Default: none.
	Recorder record.EventRecorder
	// Logger. Default slog.Default().
	Logger *slog.Logger
}

// Selector chooses the revision of each workload. It is safe for concurrent
// use.
type Selector struct {
	opts Options
	ctx  context.Context // bounds the writes of moves

	mu      sync.Mutex
	changed chan struct{}        // closed by Changed, then replaced
	writing map[types.UID]string // registrations being relabelled: the revision written
	warned  map[types.UID]string // registrations told their revision is unknown: that revision
}

// New returns a Selector whose writes end with ctx.
func New(ctx context.Context, opts Options) (*Selector, error) {
	if opts.Reader == nil || opts.Client == nil {
		return nil, fmt.Errorf("revision: Reader and Client are required")
	}
	opts.Writer = write.OrDefault(opts.Writer)
	if opts.Recorder == nil {
		opts.Recorder = registry.NoEvents{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Selector{opts: opts, ctx: ctx, changed: make(chan struct{}), writing: map[types.UID]string{}, warned: map[types.UID]string{}}, nil
}

// Known reports whether rev ("" the default) has an istiod.
func (s *Selector) Known(rev string) bool {
	return rev == "" || slices.Contains(s.opts.Revisions, rev)
}

// Changed wakes every stream waiting on a channel returned by Revision: a
// Namespace or WorkloadGroup changed (an informer event), so a workload's
// revision may have.
func (s *Selector) Changed() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// watch returns the channel the next Changed closes.
func (s *Selector) watch() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// named is the revision the labels of group's namespace and group name,
// before checking it is known. A namespace or group not (yet) in the cache
// counts as unlabelled.
func (s *Selector) named(ctx context.Context, namespace, group string) string {
	ns := &corev1.Namespace{}
	if err := s.opts.Reader.Get(ctx, types.NamespacedName{Name: namespace}, ns); client.IgnoreNotFound(err) != nil {
		s.opts.Logger.Warn("read namespace for its istio.io/rev label", "namespace", namespace, "error", err)
	}
	wg := &istionetworkingv1.WorkloadGroup{}
	if err := s.opts.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: group}, wg); client.IgnoreNotFound(err) != nil {
		s.opts.Logger.Warn("read WorkloadGroup for its istio.io/rev label", "namespace", namespace, "group", group, "error", err)
	}
	if rev := Choose(ns.Labels, wg.Labels); rev != s.opts.Default {
		return rev
	}
	return ""
}

// recorded is how revision rev ("" the default) is recorded on a
// registration and its WorkloadEntry: the default revision's own name.
func (s *Selector) recorded(rev string) string {
	if rev == "" {
		return s.opts.Default
	}
	return rev
}

// OfGroup is the revision recorded for group's workloads: the default
// revision's for a revision without an istiod. The registrar records it on new
// registrations (registry.Options.RevisionOf).
func (s *Selector) OfGroup(ctx context.Context, group *istionetworkingv1.WorkloadGroup) string {
	if rev := s.named(ctx, group.Namespace, group.Name); s.Known(rev) {
		return s.recorded(rev)
	}
	return s.recorded("")
}

// OfRegistration is the revision serving registration key now (its
// certificate requests go to that revision's CA); the default when the
// registration is not in the cache.
func (s *Selector) OfRegistration(ctx context.Context, key types.NamespacedName) string {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.opts.Reader.Get(ctx, key, war); err != nil {
		return ""
	}
	if rev := s.named(ctx, war.Namespace, war.Spec.WorkloadGroup.Name); s.Known(rev) {
		return rev
	}
	return ""
}

// Revision returns the revision the stream of registration key (of
// WorkloadGroup group) is relayed to now, and a channel closed when it may
// have changed. An unknown revision is recorded as a Warning Event and
// served by the default; a revision other than the one the registration
// records is written to the registration and its WorkloadEntry (in the
// background, within the write budget).
func (s *Selector) Revision(ctx context.Context, key types.NamespacedName, group string) (string, <-chan struct{}) {
	changed := s.watch() // before reading: a change after it wakes the stream again
	rev := s.named(ctx, key.Namespace, group)
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.opts.Reader.Get(ctx, key, war); err != nil {
		war = nil // written on the next change
	}
	if !s.Known(rev) {
		if war != nil && s.warn(war.UID, rev) {
			s.opts.Recorder.Eventf(war, corev1.EventTypeWarning, ReasonUnknownIstioRevision,
				"istio.io/rev %q has no istiod in this Embark (istiod.revisions); the default revision serves the workload", rev)
			s.opts.Logger.Warn("unknown istiod revision; the default revision serves the workload", "registration", key.String(), "revision", rev)
		}
		rev = ""
	} else if war != nil {
		s.warn(war.UID, "")
	}
	if war != nil && war.Annotations[registry.AnnotationIstioRevision] != s.recorded(rev) {
		s.record(war, s.recorded(rev))
	}
	return rev, changed
}

// warn records that registration uid was told its revision rev ("": a
// known one) is unknown, and reports whether that is news: a stream woken by
// an unrelated Namespace or WorkloadGroup change is not told again.
func (s *Selector) warn(uid types.UID, rev string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned[uid] == rev {
		return false
	}
	if rev == "" {
		delete(s.warned, uid)
	} else {
		s.warned[uid] = rev
	}
	return true
}

// record writes rev to war and its WorkloadEntry in the background, once
// per registration at a time.
func (s *Selector) record(war *runtimev1alpha1.WorkloadAutoRegistration, rev string) {
	s.mu.Lock()
	if w, ok := s.writing[war.UID]; ok && w == rev {
		s.mu.Unlock()
		return
	}
	s.writing[war.UID] = rev
	s.mu.Unlock()
	from := war.Annotations[registry.AnnotationIstioRevision]
	key := types.NamespacedName{Namespace: war.Namespace, Name: war.Name}
	go func() {
		err := s.write(s.ctx, key, war.UID, rev)
		s.mu.Lock()
		if s.writing[war.UID] == rev {
			delete(s.writing, war.UID)
		}
		s.mu.Unlock()
		if err != nil {
			s.opts.Logger.Warn("record a workload's istiod revision", "registration", key.String(), "revision", rev, "error", err)
			return
		}
		s.opts.Recorder.Eventf(war, corev1.EventTypeNormal, ReasonIstioRevisionChanged, "served by istiod revision %s (was %s)", label(rev), label(from))
		s.opts.Logger.Info("workload moved to another istiod revision", "registration", key.String(), "from", label(from), "to", label(rev))
	}()
}

// label is how a revision is shown: "default" for "".
func label(rev string) string {
	if rev == "" {
		return Default
	}
	return rev
}

// write sets the revision annotation of the registration and of its
// WorkloadEntry (removed for a default revision without a name). The entry
// never carries istio.io/rev, on its metadata or its endpoint labels: istiod
// takes an entry labelled with a revision only when it is its own, and a
// VM's entry must stay an endpoint for the pods of every revision while the
// VM moves. A label written by an earlier version is removed.
func (s *Selector) write(ctx context.Context, key types.NamespacedName, uid types.UID, rev string) error {
	w := s.opts.Writer
	c := s.opts.Client
	if err := w.Do(ctx, func(ctx context.Context) error {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := c.Get(ctx, key, war); err != nil {
			return err
		}
		if war.UID != uid || war.Annotations[registry.AnnotationIstioRevision] == rev {
			return nil
		}
		setOrDelete(&war.Annotations, registry.AnnotationIstioRevision, rev)
		return c.Update(ctx, war)
	}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("registration %s: %w", key, err)
	}
	return w.Do(ctx, func(ctx context.Context) error {
		we := &istionetworkingv1.WorkloadEntry{}
		if err := c.Get(ctx, key, we); err != nil {
			return client.IgnoreNotFound(err)
		}
		cur, has := we.Annotations[registry.AnnotationIstioRevision]
		_, labelled := we.Labels[LabelRevision]
		_, specLabelled := we.Spec.Labels[LabelRevision]
		if cur == rev && has == (rev != "") && !labelled && !specLabelled {
			return nil
		}
		setOrDelete(&we.Annotations, registry.AnnotationIstioRevision, rev)
		delete(we.Labels, LabelRevision)
		delete(we.Spec.Labels, LabelRevision)
		return c.Update(ctx, we)
	})
}

// setOrDelete sets (*m)[k] = v, or deletes k when v is empty.
func setOrDelete(m *map[string]string, k, v string) {
	if v == "" {
		delete(*m, k)
		return
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[k] = v
}

var _ xds.RevisionSelector = (*Selector)(nil)
