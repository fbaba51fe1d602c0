package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// Reasons of the WorkloadGroupOutOfDate condition.
const (
	// ReasonWorkloadGroupChanged: the WorkloadGroup's spec differs from the
	// registration's snapshot.
	ReasonWorkloadGroupChanged = "WorkloadGroupChanged"
	// ReasonUpToDate: the WorkloadGroup's spec equals the snapshot.
	ReasonUpToDate = "UpToDate"
	// ReasonSnapshotUnreadable: the snapshot cannot be decoded.
	ReasonSnapshotUnreadable = "SnapshotUnreadable"
)

// diffDepth is how deep SpecDiff names differing fields: template.labels,
// not template.labels[app].
const diffDepth = 2

// SpecDiff returns the fields in which two WorkloadGroup specs differ, as
// JSON paths of at most two levels (metadata.labels, template.serviceAccount,
// probe.httpGet), sorted. It compares the decoded specs semantically: an unset
// message equals an empty one, maps compare as maps, and the JSON spelling
// the snapshot was stored with does not matter.
func SpecDiff(snapshot, current *istioapi.WorkloadGroup) []string {
	var out []string
	diffMessage(snapshot.ProtoReflect(), current.ProtoReflect(), "", 1, &out)
	slices.Sort(out)
	return out
}

func diffMessage(a, b protoreflect.Message, prefix string, depth int, out *[]string) {
	fields := a.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		path := fd.JSONName()
		if prefix != "" {
			path = prefix + "." + path
		}
		va, vb := a.Get(fd), b.Get(fd)
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			// Singular message: unset and empty are the same.
			if depth < diffDepth {
				diffMessage(va.Message(), vb.Message(), path, depth+1, out)
			} else if !messagesEqual(va.Message(), vb.Message()) {
				*out = append(*out, path)
			}
			continue
		}
		if !va.Equal(vb) {
			*out = append(*out, path)
		}
	}
}

// messagesEqual is proto.Equal with an unset (invalid) message equal to an
// empty one.
func messagesEqual(a, b protoreflect.Message) bool {
	empty := func(m protoreflect.Message) bool {
		if !m.IsValid() {
			return true
		}
		n := 0
		m.Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool { n++; return false })
		return n == 0
	}
	if empty(a) || empty(b) {
		return empty(a) && empty(b)
	}
	return proto.Equal(a.Interface(), b.Interface())
}

// driftCondition is the WorkloadGroupOutOfDate condition of war against the
// WorkloadGroup group (the one it was snapshotted from).
func driftCondition(war *runtimev1alpha1.WorkloadAutoRegistration, group *istionetworkingv1.WorkloadGroup) metav1.Condition {
	cond := metav1.Condition{Type: runtimev1alpha1.ConditionWorkloadGroupOutOfDate, ObservedGeneration: war.Generation}
	snap, err := registry.GroupSpec(war.Spec.WorkloadGroup)
	if err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, ReasonSnapshotUnreadable, err.Error()
		return cond
	}
	diff := SpecDiff(snap, &group.Spec)
	if len(diff) == 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonUpToDate
		cond.Message = fmt.Sprintf("WorkloadGroup %s (generation %d) equals the snapshot this workload joined with (generation %d)",
			group.Name, group.Generation, war.Spec.WorkloadGroup.Generation)
		return cond
	}
	cond.Status, cond.Reason = metav1.ConditionTrue, ReasonWorkloadGroupChanged
	cond.Message = fmt.Sprintf("WorkloadGroup %s changed since this workload joined (snapshot generation %d, current generation %d): %s differ; "+
		"the workload keeps its configuration until it onboards again (kubectl delete war %s -n %s)",
		group.Name, war.Spec.WorkloadGroup.Generation, group.Generation, strings.Join(diff, ", "), war.Name, war.Namespace)
	return cond
}

// driftReconciler keeps the WorkloadGroupOutOfDate condition of every
// registration, level-based from the informer caches of registrations and
// WorkloadGroups. Only the sweeper leader runs it, so two replicas never
// write the condition at once.
type driftReconciler struct {
	client  client.Client
	reader  client.Reader
	cache   cache.Cache
	writer  *write.Writer
	log     *slog.Logger
	metrics *Metrics
	resync  time.Duration
	workers int
	now     func() time.Time
}

// run reconciles until ctx ends.
func (d *driftReconciler) run(ctx context.Context) error {
	l := newLoop(d.cache, "drift", d.reconcile, d.workers, d.resync, d.log)
	defer l.ShutDown()
	if err := watchRegistrations(ctx, l, d.cache); err != nil {
		return err
	}
	err := l.Watch(ctx, d.cache, &istionetworkingv1.WorkloadGroup{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { d.enqueueGroup(ctx, l, obj) },
		UpdateFunc: func(_, obj any) { d.enqueueGroup(ctx, l, obj) },
	})
	if err != nil {
		return err
	}
	l.Run(ctx)
	return nil
}

// enqueueGroup queues the registrations snapshotted from a WorkloadGroup.
func (d *driftReconciler) enqueueGroup(ctx context.Context, q queue, obj any) {
	group, ok := obj.(*istionetworkingv1.WorkloadGroup)
	if !ok {
		return
	}
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := d.cache.List(ctx, list, client.InNamespace(group.Namespace)); err != nil {
		d.log.Error("list registrations of a WorkloadGroup", "group", group.Namespace+"/"+group.Name, "error", err)
		return
	}
	for i := range list.Items {
		if list.Items[i].Spec.WorkloadGroup.Name == group.Name {
			q.Add(client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
}

// reconcile sets the WorkloadGroupOutOfDate condition of one registration.
func (d *driftReconciler) reconcile(ctx context.Context, key types.NamespacedName) error {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := d.cache.Get(ctx, key, war); err != nil {
		return client.IgnoreNotFound(err)
	}
	if war.DeletionTimestamp != nil {
		return nil
	}
	group := &istionetworkingv1.WorkloadGroup{}
	err := d.cache.Get(ctx, types.NamespacedName{Namespace: war.Namespace, Name: war.Spec.WorkloadGroup.Name}, group)
	if apierrors.IsNotFound(err) {
		return nil // the owner reference removes the registration
	}
	if err != nil {
		return fmt.Errorf("read WorkloadGroup %s/%s: %w", war.Namespace, war.Spec.WorkloadGroup.Name, err)
	}
	if uid := war.Spec.WorkloadGroup.UID; uid != "" && uid != group.UID {
		return nil // a new group of the same name; the old one's registrations are being removed
	}
	if !conditionDiffers(war.Status.Conditions, driftCondition(war, group)) {
		return nil
	}
	var written metav1.Condition
	ok, err := registry.UpdateRegistrationStatus(ctx, d.writer, d.client, d.reader, war, func(cur *runtimev1alpha1.WorkloadAutoRegistration) bool {
		cond := driftCondition(cur, group)
		if !conditionDiffers(cur.Status.Conditions, cond) {
			return false
		}
		cond.LastTransitionTime = metav1.NewTime(d.now())
		meta.SetStatusCondition(&cur.Status.Conditions, cond)
		written = cond
		return true
	})
	if err != nil {
		return fmt.Errorf("write %s condition of %s: %w", runtimev1alpha1.ConditionWorkloadGroupOutOfDate, key, err)
	}
	if ok {
		d.metrics.driftWritten(written.Status)
		d.log.Info("WorkloadGroup drift condition changed", "registration", key.String(), "status", written.Status, "reason", written.Reason, "message", written.Message)
	}
	return nil
}

// conditionDiffers reports whether setting want would change conditions.
func conditionDiffers(conditions []metav1.Condition, want metav1.Condition) bool {
	cur := meta.FindStatusCondition(conditions, want.Type)
	return cur == nil || cur.Status != want.Status || cur.Reason != want.Reason || cur.Message != want.Message || cur.ObservedGeneration != want.ObservedGeneration
}
