package registry

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// A workload's labels, and so which Services, ServiceEntries, Sidecars and
// policies select it, are decided by its WorkloadGroup, never by the VM:
//
//	template.labels < spec.metadata.labels < allowed agent labels < owned labels
//
// The WorkloadGroup's spec.metadata.labels win over its template's, as in
// Istio's own auto-registration. What the agent reports is accepted only
// for keys the group allows (AnnotationAgentLabels; by default "version"),
// never for a key the group sets to another value, and never for a reserved
// key (ReservedLabel). The owned labels are computed last and always win:
// the network, the host name proven by the identity, and Istio's canonical
// service name and revision. An entry never carries Istio's control-plane
// revision label (LabelRevision), whatever the group's labels say: istiod
// takes a WorkloadEntry labelled with a revision only when it is its own,
// and a VM's entry is mesh data every revision must see, like a pod's
// endpoints.
const (
	// AnnotationAgentLabels on a WorkloadGroup lists, comma-separated, the
	// label keys its workloads' agents may report (onboarding-agent's
	// workload.labels). Absent: DefaultAgentLabelKeys. Empty: none.
	AnnotationAgentLabels = "onboarding.tetrate.io/agent-labels"
	// LabelHostname is the workload's host name, where its identity
	// proves one (HostnameOf), as Istio's VM entries carry it.
	LabelHostname = "hostname"
	// LabelCanonicalName and LabelCanonicalRevision are Istio's canonical
	// service labels, which telemetry and istioctl name a workload by.
	LabelCanonicalName     = "service.istio.io/canonical-name"
	LabelCanonicalRevision = "service.istio.io/canonical-revision"
	// LabelRevision is Istio's control-plane revision label. A
	// WorkloadGroup's own label chooses its workloads' revision; their
	// WorkloadEntries never carry it (neither metadata nor endpoint
	// labels), so that the istiod of every revision takes them.
	LabelRevision = "istio.io/rev"
	// AnnotationIstioRevision on a registration, and on its WorkloadEntry
	// for operators, is the Istio revision of the istiod serving the
	// workload (Options.Revision or Options.RevisionOf); absent for a
	// default revision without a name. istiod does not read it.
	AnnotationIstioRevision = "onboarding.tetrate.io/istio-revision"
)

// DefaultAgentLabelKeys are the label keys an agent may report when its
// WorkloadGroup does not say (AnnotationAgentLabels).
var DefaultAgentLabelKeys = []string{"version"}

// ownedLabels are the labels Embark computes for every entry; no group or
// agent value overrides them.
var ownedLabels = []string{LabelNetwork, LabelHostname, LabelCanonicalName, LabelCanonicalRevision}

// reservedDomains are the label key prefixes (DNS domains and their
// subdomains) that belong to Istio, Kubernetes or Embark: an agent never
// sets a key in them, whatever its group allows.
var reservedDomains = []string{"istio.io", "kubernetes.io", "k8s.io", "onboarding.tetrate.io"}

// reservedNames are label keys without a prefix that Istio or Embark read
// with a meaning of their own.
var reservedNames = []string{"istio", "istio-locality", LabelHostname}

// ReservedLabel reports whether key belongs to Istio, Kubernetes or Embark:
// security.istio.io/tlsMode, topology.istio.io/network,
// service.istio.io/canonical-name, istio.io/rev, app.kubernetes.io/name,
// istio-locality, istio (gateway selectors), hostname. An agent may never
// report one.
func ReservedLabel(key string) bool {
	prefix, _, found := strings.Cut(key, "/")
	if !found {
		return slices.Contains(reservedNames, key)
	}
	for _, d := range reservedDomains {
		if prefix == d || strings.HasSuffix(prefix, "."+d) {
			return true
		}
	}
	return false
}

// AgentLabelKeys returns the label keys group's agents may report.
func AgentLabelKeys(group *istionetworkingv1.WorkloadGroup) []string {
	v, ok := group.GetAnnotations()[AnnotationAgentLabels]
	if !ok {
		return DefaultAgentLabelKeys
	}
	var keys []string
	for k := range strings.SplitSeq(v, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// groupLabels returns the labels a group gives every workload:
// template.labels with spec.metadata.labels over them.
func groupLabels(spec *istioapi.WorkloadGroup) map[string]string {
	out := maps.Clone(spec.GetTemplate().GetLabels())
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, spec.GetMetadata().GetLabels())
	return out
}

// validateAgentLabels checks the labels an agent reported against what its
// group allows (see the package's label rules).
func validateAgentLabels(path *field.Path, labels map[string]string, group *istionetworkingv1.WorkloadGroup) field.ErrorList {
	var errs field.ErrorList
	if len(labels) > 64 {
		errs = append(errs, field.TooMany(path, len(labels), 64))
	}
	set := groupLabels(&group.Spec)
	allowed := AgentLabelKeys(group)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(path.Key(k), k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(path.Key(k), v, msg))
		}
		switch gv, groupSets := set[k]; {
		case groupSets && gv == v:
			// The group's own value: reporting it changes nothing.
		case groupSets:
			errs = append(errs, field.Forbidden(path.Key(k), fmt.Sprintf("WorkloadGroup %s sets %s=%s; a workload cannot change it", group.Name, k, gv)))
		case ReservedLabel(k):
			errs = append(errs, field.Forbidden(path.Key(k), fmt.Sprintf("%s is reserved for Istio, Kubernetes or Embark; a workload cannot set it", k)))
		case !slices.Contains(allowed, k):
			errs = append(errs, field.Forbidden(path.Key(k), fmt.Sprintf("WorkloadGroup %s does not let its workloads set %s (allowed: %s; annotation %s)",
				group.Name, k, allowedText(allowed), AnnotationAgentLabels)))
		}
	}
	return errs
}

func allowedText(keys []string) string {
	if len(keys) == 0 {
		return "none"
	}
	return strings.Join(keys, ", ")
}

// WorkloadLabels returns a registration's labels: its group's (the
// snapshot's template and spec.metadata labels) without LabelRevision, the
// agent's where the group allowed them at registration, and the owned
// labels (network, host name, canonical service), which always win. Istio's
// auto-registration copies a group's spec labels, istio.io/rev among them;
// on an Embark entry that label would hide the VM from the istiods of
// every other revision, so it is left out.
func WorkloadLabels(war *runtimev1alpha1.WorkloadAutoRegistration, group *istioapi.WorkloadGroup) map[string]string {
	set := groupLabels(group)
	labels := make(map[string]string, len(set)+len(war.Spec.Registration.Workload.Labels)+4)
	// Agent labels were checked at registration; still, a reserved key or
	// one the group sets never comes from them (a registration written by
	// an earlier version, or a group changed since).
	for k, v := range war.Spec.Registration.Workload.Labels {
		if _, groupSets := set[k]; !groupSets && !ReservedLabel(k) {
			labels[k] = v
		}
	}
	maps.Copy(labels, set)
	for _, k := range ownedLabels {
		delete(labels, k)
	}
	delete(labels, LabelRevision)
	if n := group.GetTemplate().GetNetwork(); n != "" {
		labels[LabelNetwork] = n
	}
	if h := HostnameOf(war); h != "" {
		labels[LabelHostname] = h
	}
	labels[LabelCanonicalName] = canonicalName(set, labels, war.Spec.WorkloadGroup.Name)
	labels[LabelCanonicalRevision] = canonicalRevision(set, labels)
	return labels
}

// canonicalName is Istio's canonical service name of a workload: the
// group's service.istio.io/canonical-name, else app.kubernetes.io/name,
// else app, else the WorkloadGroup's name.
func canonicalName(set, labels map[string]string, group string) string {
	if v := set[LabelCanonicalName]; v != "" {
		return v
	}
	for _, k := range []string{"app.kubernetes.io/name", "app"} {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return group
}

// canonicalRevision is Istio's canonical revision: the group's
// service.istio.io/canonical-revision, else app.kubernetes.io/version,
// else version, else "latest".
func canonicalRevision(set, labels map[string]string) string {
	if v := set[LabelCanonicalRevision]; v != "" {
		return v
	}
	for _, k := range []string{"app.kubernetes.io/version", "version"} {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return "latest"
}

// HostnameOf returns the host name a registration's identity proves, as a
// label value, or "": an EC2 instance's private DNS host name
// (ip-10-0-0-7, from its VPC address), a GCE instance's or Azure VM's name
// or a JWT
// subject that is a valid label value (an on-prem host's name). What the VM reports is not used.
func HostnameOf(war *runtimev1alpha1.WorkloadAutoRegistration) string {
	id := war.Spec.Identity
	var h string
	switch {
	case id.AWS != nil && id.AWS.EC2 != nil:
		for _, a := range war.Spec.Registration.Host.Addresses {
			if a.Type != runtimev1alpha1.AddressTypeVPC {
				continue
			}
			if ip, err := netip.ParseAddr(a.IP); err == nil && ip.Is4() {
				h = "ip-" + strings.ReplaceAll(ip.String(), ".", "-")
			}
			break
		}
	case id.JWT != nil:
		h = id.JWT.Subject
	case id.GCP != nil:
		h = id.GCP.InstanceName
	case id.Azure != nil:
		h = id.Azure.VMName
	case id.ECS != nil:
		h = id.ECS.TaskID
	}
	if len(validation.IsValidLabelValue(h)) > 0 {
		return ""
	}
	return h
}

// entryAnnotations returns the annotations a registration's WorkloadEntry
// carries from its group (spec.metadata.annotations), without istiod's
// auto-registration annotations (they would make istiod delete the entry)
// and without Embark's own keys, which the caller sets.
func entryAnnotations(group *istioapi.WorkloadGroup) map[string]string {
	out := map[string]string{}
	for k, v := range group.GetMetadata().GetAnnotations() {
		if slices.Contains(IstiodAnnotations, k) || ownedAnnotation(k) {
			continue
		}
		out[k] = v
	}
	return out
}

// ownedAnnotation reports whether Embark writes annotation key itself.
func ownedAnnotation(key string) bool {
	prefix, _, found := strings.Cut(key, "/")
	return key == AnnotationHealthChecksEnabled || (found && (prefix == "onboarding.tetrate.io" || strings.HasSuffix(prefix, ".onboarding.tetrate.io")))
}
