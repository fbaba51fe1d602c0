package registry

import (
	"strings"

	"encoding/json"
	"fmt"
	"maps"
	"strconv"

	istiometa "istio.io/api/meta/v1alpha1"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// Annotations and labels Embark writes on WorkloadEntries. They are Embark's
// own (prefix onboarding.tetrate.io/), never istiod's auto-registration
// annotations: istiod's WorkloadEntry clean-up, in every istiod, deletes
// entries carrying istio.io/autoRegistrationGroup and strips the Healthy
// condition of entries carrying istio.io/workloadController once their
// istio.io/connectedAt or istio.io/disconnectedAt is old enough (see
// IstiodAnnotations and docs/istiod.md).
const (
	// AnnotationWorkloadGroup names the WorkloadGroup a WorkloadEntry was
	// registered for. Written at registration.
	AnnotationWorkloadGroup = "onboarding.tetrate.io/workload-group"
	// AnnotationConnectedAt is when the workload's sidecar last connected
	// (RFC 3339), written by the replica holding its stream.
	AnnotationConnectedAt = "onboarding.tetrate.io/connected-at"
	// AnnotationDisconnectedAt was when the workload's sidecar last
	// disconnected (RFC 3339). No longer written (a disconnect writes the
	// registration's status.connection.disconnectedAt only); a connect
	// removes it from entries written by earlier versions.
	AnnotationDisconnectedAt = "onboarding.tetrate.io/disconnected-at"
	// AnnotationConnectedReplica is the endpoint replica holding (or last
	// holding) the workload's stream.
	AnnotationConnectedReplica = "onboarding.tetrate.io/connected-replica"
	// AnnotationOutOfTraffic marks a WorkloadEntry of a group without a
	// probe that the replica whose stream of the workload closed took out
	// of traffic (its value is the reason, AgentDisconnected): it is written
	// together with AnnotationHealthChecksEnabled, which, with no Healthy
	// condition True, makes istiod stop routing to the entry. A connect
	// removes both. Entries of groups with a probe are taken out of traffic
	// through their Healthy condition instead (docs/lifecycle.md).
	AnnotationOutOfTraffic = "onboarding.tetrate.io/out-of-traffic"
	// AnnotationRegistrationGeneration is the registration's generation the
	// WorkloadEntry was built from, so a concurrent older write never
	// replaces a newer one.
	AnnotationRegistrationGeneration = "onboarding.tetrate.io/registration-generation"
	// LabelNetwork is Istio's topology label for the workload's network.
	LabelNetwork = "topology.istio.io/network"
	// DefaultServiceAccount is used when the WorkloadGroup template names none.
	DefaultServiceAccount = "default"
)

// IstiodAnnotations are istiod's own auto-registration annotations. Embark
// never writes them, and removes them from its WorkloadEntries whenever it
// writes one (entries written by earlier Embark versions carried them):
// istiod takes an entry carrying them for one it auto-registered and deletes
// it, or removes its Healthy condition, after its clean-up grace period.
var IstiodAnnotations = []string{
	"istio.io/autoRegistrationGroup",
	"istio.io/connectedAt",
	"istio.io/disconnectedAt",
	"istio.io/workloadController",
}

// HasIstiodAnnotations reports whether ann holds any of IstiodAnnotations.
func HasIstiodAnnotations(ann map[string]string) bool {
	for _, k := range IstiodAnnotations {
		if _, ok := ann[k]; ok {
			return true
		}
	}
	return false
}

// WithoutIstiodAnnotations returns a copy of ann without IstiodAnnotations.
func WithoutIstiodAnnotations(ann map[string]string) map[string]string {
	out := maps.Clone(ann)
	for _, k := range IstiodAnnotations {
		delete(out, k)
	}
	return out
}

// GroupSpec decodes the WorkloadGroup spec held in a registration's snapshot.
func GroupSpec(snap runtimev1alpha1.WorkloadGroupSnapshot) (*istioapi.WorkloadGroup, error) {
	spec := &istioapi.WorkloadGroup{}
	if len(snap.Spec.Raw) == 0 {
		return spec, nil
	}
	if err := json.Unmarshal(snap.Spec.Raw, spec); err != nil {
		return nil, fmt.Errorf("decode WorkloadGroup snapshot of %s: %w", snap.Name, err)
	}
	return spec, nil
}

// Snapshot takes the snapshot of a WorkloadGroup that a registration keeps.
func Snapshot(group *istionetworkingv1.WorkloadGroup) (runtimev1alpha1.WorkloadGroupSnapshot, error) {
	raw, err := json.Marshal(&group.Spec)
	if err != nil {
		return runtimev1alpha1.WorkloadGroupSnapshot{}, fmt.Errorf("snapshot WorkloadGroup %s/%s: %w", group.Namespace, group.Name, err)
	}
	return runtimev1alpha1.WorkloadGroupSnapshot{
		Name:       group.Name,
		UID:        group.UID,
		Generation: group.Generation,
		Spec:       rawExtension(raw),
	}, nil
}

// WorkloadAddress returns the address the workload is reached at in the mesh:
// the first host address of the type settings.connectedOver names (VPC when
// unset).
func WorkloadAddress(reg runtimev1alpha1.Registration) (string, error) {
	want := reg.Settings.ConnectedOver
	if want == "" {
		want = runtimev1alpha1.AddressTypeVPC
	}
	for _, a := range reg.Host.Addresses {
		if a.Type == want {
			return a.IP, nil
		}
	}
	return "", fmt.Errorf("no host address of type %s (settings.connectedOver)", want)
}

// ValidateRegistration checks what a workload reported against the
// WorkloadGroup it joins. The workload's own labels are accepted only for
// keys the group allows, never for a key the group sets to another value or
// a reserved key (labels.go): a workload cannot move itself into another
// service's selection or set Istio's own labels.
func ValidateRegistration(reg runtimev1alpha1.Registration, group *istionetworkingv1.WorkloadGroup) field.ErrorList {
	var errs field.ErrorList
	addrs := field.NewPath("registration", "host", "addresses")
	if len(reg.Host.Addresses) == 0 {
		errs = append(errs, field.Required(addrs, "at least one host address"))
	}
	if len(reg.Host.Addresses) > 16 {
		errs = append(errs, field.TooMany(addrs, len(reg.Host.Addresses), 16))
	}
	for i, a := range reg.Host.Addresses {
		if ip, err := ParseWorkloadAddress(a.IP, true); err != nil {
			errs = append(errs, field.Invalid(addrs.Index(i).Child("ip"), a.IP, "must be a workload's unicast IPv4 or IPv6 address: "+err.Error()))
		} else if ip.String() != a.IP {
			errs = append(errs, field.Invalid(addrs.Index(i).Child("ip"), a.IP, "must be in canonical form "+ip.String()))
		}
		if a.Type != runtimev1alpha1.AddressTypeVPC && a.Type != runtimev1alpha1.AddressTypeInternet {
			errs = append(errs, field.NotSupported(addrs.Index(i).Child("type"), a.Type, []string{string(runtimev1alpha1.AddressTypeVPC), string(runtimev1alpha1.AddressTypeInternet)}))
		}
	}
	if c := reg.Settings.ConnectedOver; c != "" && c != runtimev1alpha1.AddressTypeVPC && c != runtimev1alpha1.AddressTypeInternet {
		errs = append(errs, field.NotSupported(field.NewPath("registration", "settings", "connectedOver"), c, []string{string(runtimev1alpha1.AddressTypeVPC), string(runtimev1alpha1.AddressTypeInternet)}))
	} else if len(errs) == 0 {
		if _, err := WorkloadAddress(reg); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("registration", "settings", "connectedOver"), reg.Settings.ConnectedOver, err.Error()))
		}
	}
	for _, v := range []struct {
		path  *field.Path
		value string
	}{
		{field.NewPath("registration", "agent", "version"), reg.Agent.Version},
		{field.NewPath("registration", "sidecar", "istio", "version"), reg.Sidecar.Istio.Version},
	} {
		if len(v.value) > 128 {
			errs = append(errs, field.TooLong(v.path, v.value, 128))
		}
	}
	errs = append(errs, validateAgentLabels(field.NewPath("registration", "workload", "labels"), reg.Workload.Labels, group)...)
	return errs
}

// BuildWorkloadEntry returns the WorkloadEntry of a registration, derived from
// its WorkloadGroup snapshot (not the live WorkloadGroup: a workload keeps the
// configuration it joined with) and what it registered. It is owned by the
// registration, so deleting the registration deletes it.
func BuildWorkloadEntry(war *runtimev1alpha1.WorkloadAutoRegistration) (*istionetworkingv1.WorkloadEntry, error) {
	group, err := GroupSpec(war.Spec.WorkloadGroup)
	if err != nil {
		return nil, err
	}
	address, err := WorkloadAddress(war.Spec.Registration)
	if err != nil {
		return nil, err
	}
	tmpl := group.GetTemplate()
	labels := WorkloadLabels(war, group)
	annotations := entryAnnotations(group)
	annotations[AnnotationWorkloadGroup] = war.Spec.WorkloadGroup.Name
	annotations[AnnotationRegistrationGeneration] = strconv.FormatInt(war.Generation, 10)
	if rev := war.Annotations[AnnotationIstioRevision]; rev != "" {
		annotations[AnnotationIstioRevision] = rev
	}
	sa := tmpl.GetServiceAccount()
	if sa == "" {
		sa = DefaultServiceAccount
	}
	we := &istionetworkingv1.WorkloadEntry{
		ObjectMeta: metav1.ObjectMeta{
			Name:        war.Name,
			Namespace:   war.Namespace,
			Labels:      labels,
			Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         runtimev1alpha1.SchemeGroupVersion.String(),
				Kind:               "WorkloadAutoRegistration",
				Name:               war.Name,
				UID:                war.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
	}
	if group.GetProbe() != nil {
		// As istiod's auto-registration does: istiod then routes to the
		// entry only while its Healthy condition is True, so the workload is
		// unhealthy until its first passing probe.
		we.Annotations[AnnotationHealthChecksEnabled] = "true"
	}
	we.Spec.Address = address
	we.Spec.Labels = maps.Clone(labels)
	we.Spec.Ports = maps.Clone(tmpl.GetPorts())
	we.Spec.Network = tmpl.GetNetwork()
	we.Spec.Locality = locality(war.Spec.Identity)
	we.Spec.Weight = tmpl.GetWeight()
	we.Spec.ServiceAccount = sa
	return we, nil
}

// locality is Istio's region/zone locality of a workload, when known.
func locality(id runtimev1alpha1.WorkloadIdentity) string {
	if id.AWS != nil && id.AWS.Region != "" && id.AWS.Zone != "" {
		return id.AWS.Region + "/" + id.AWS.Zone
	}
	if id.ECS != nil && id.ECS.Region != "" && id.ECS.Zone != "" {
		return id.ECS.Region + "/" + id.ECS.Zone
	}
	if id.GCP != nil {
		if region, ok := gcpRegion(id.GCP.Zone); ok {
			return region + "/" + id.GCP.Zone
		}
	}
	// An Azure VM's location is known only from Azure Resource Manager;
	// its availability zone is not read.
	if id.Azure != nil && id.Azure.VMConfirmed {
		return id.Azure.Location
	}
	return ""
}

// OwnedBy reports whether obj's controller is the registration named name
// with UID uid.
func OwnedBy(refs []metav1.OwnerReference, name string) (metav1.OwnerReference, bool) {
	for _, ref := range refs {
		if ref.Kind == "WorkloadAutoRegistration" && ref.APIVersion == runtimev1alpha1.SchemeGroupVersion.String() && ref.Controller != nil && *ref.Controller && (name == "" || ref.Name == name) {
			return ref, true
		}
	}
	return metav1.OwnerReference{}, false
}

// Health condition of a WorkloadEntry, as istiod reads it.
const (
	// AnnotationHealthChecksEnabled on a WorkloadEntry makes istiod route to
	// it only while its Healthy condition is True (no condition: unhealthy).
	// Registration sets it when the WorkloadGroup has a probe, as istiod's
	// own auto-registration does.
	AnnotationHealthChecksEnabled = "proxy.istio.io/health-checks-enabled"
	// ConditionHealthy is the WorkloadEntry (and registration) condition
	// that mirrors the workload's readiness probe.
	ConditionHealthy = runtimev1alpha1.ConditionHealthy
)

// IstioCondition returns the condition of type typ in conds, or nil.
func IstioCondition(conds []*istiometa.IstioCondition, typ string) *istiometa.IstioCondition {
	for _, c := range conds {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

// SetIstioCondition returns conds with c in place of any condition of its
// type.
func SetIstioCondition(conds []*istiometa.IstioCondition, c *istiometa.IstioCondition) []*istiometa.IstioCondition {
	out := make([]*istiometa.IstioCondition, 0, len(conds)+1)
	for _, old := range conds {
		if old.GetType() != c.GetType() {
			out = append(out, old)
		}
	}
	return append(out, c)
}

// gcpRegion is the region of a Compute Engine zone: us-central1 of
// us-central1-a.
func gcpRegion(zone string) (string, bool) {
	i := strings.LastIndexByte(zone, '-')
	if i <= 0 {
		return "", false
	}
	return zone[:i], true
}
