// Package selection decides which Istio objects apply to a workload, as
// istiod decides it for a sidecar: label selectors (LabelsMatch), the
// Sidecar that applies (Sidecar), the PeerAuthentication mode of an ingress
// port (PeerAuthMode), the host forms of a Sidecar egress listener
// (ParseHostForm, HostForm.Matches) and exportTo visibility (ExportedTo).
// It reads objects and returns answers: no Envoy resources.
package selection

import (
	"sort"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Sidecar picks the Sidecar that applies to a workload of namespace ns
// with the given labels the way Istio does: a Sidecar of that namespace
// whose workloadSelector matches the labels (the oldest, then the first by
// name, when several match), else the namespace's selector-less Sidecar (same tie
// rule), else the root namespace's selector-less Sidecar, else nil.
func Sidecar(sidecars []*istionetworkingv1.Sidecar, ns string, labels map[string]string, root string) *istionetworkingv1.Sidecar {
	var withSel, nsDefault, rootDefault []*istionetworkingv1.Sidecar
	for _, sc := range sidecars {
		if sc == nil {
			continue
		}
		sel := sc.Spec.GetWorkloadSelector().GetLabels()
		switch {
		case sc.Namespace == ns && len(sel) > 0:
			if LabelsMatch(sel, labels) {
				withSel = append(withSel, sc)
			}
		case sc.Namespace == ns:
			nsDefault = append(nsDefault, sc)
		case sc.Namespace == root && len(sel) == 0:
			rootDefault = append(rootDefault, sc)
		}
	}
	for _, group := range [][]*istionetworkingv1.Sidecar{withSel, nsDefault, rootDefault} {
		if len(group) > 0 {
			return oldest(group, func(s *istionetworkingv1.Sidecar) v1.Object { return s })
		}
	}
	return nil
}

// oldest returns the object with the earliest creationTimestamp, ties
// broken by name (Istio's conflict rule).
func oldest[T any](objs []T, meta func(T) v1.Object) T {
	sorted := append([]T(nil), objs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := meta(sorted[i]), meta(sorted[j])
		ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
		if !ta.Equal(&tb) {
			return ta.Before(&tb)
		}
		return a.GetName() < b.GetName()
	})
	return sorted[0]
}

// LabelsMatch reports whether every selector label is in labels. An empty
// selector matches everything.
func LabelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		got, ok := labels[k]
		if !ok || got != v {
			return false
		}
	}
	return true
}

// MTLSMode is how an ingress port accepts connections.
type MTLSMode string

// The modes of PeerAuthentication that translation distinguishes.
const (
	// MTLSPermissive accepts Istio mutual TLS and plaintext (the default).
	MTLSPermissive MTLSMode = "PERMISSIVE"
	// MTLSStrict accepts Istio mutual TLS only.
	MTLSStrict MTLSMode = "STRICT"
	// MTLSDisable accepts plaintext only.
	MTLSDisable MTLSMode = "DISABLE"
)

// PeerAuthMode computes the effective mode for the ingress port of a
// workload of namespace ns with the given labels as Istio does: the
// workload-selector PeerAuthentication (its port-level setting first), else the namespace's selector-less one, else the root
// namespace's, each level "UNSET" inheriting from the next; PERMISSIVE when
// nothing says otherwise.
func PeerAuthMode(pas []*istiosecurityv1.PeerAuthentication, ns string, labels map[string]string, root string, port uint32) MTLSMode {
	var withSel, nsDefault, rootDefault []*istiosecurityv1.PeerAuthentication
	for _, pa := range pas {
		if pa == nil {
			continue
		}
		sel := pa.Spec.GetSelector().GetMatchLabels()
		switch {
		case pa.Namespace == ns && len(sel) > 0:
			if LabelsMatch(sel, labels) {
				withSel = append(withSel, pa)
			}
		case pa.Namespace == ns:
			nsDefault = append(nsDefault, pa)
		case pa.Namespace == root && len(sel) == 0:
			rootDefault = append(rootDefault, pa)
		}
	}
	meta := func(p *istiosecurityv1.PeerAuthentication) v1.Object { return p }
	if len(withSel) > 0 {
		pa := oldest(withSel, meta)
		if m := modeOf(pa.Spec.GetPortLevelMtls()[port].GetMode().String()); m != "" {
			return m
		}
		if m := modeOf(pa.Spec.GetMtls().GetMode().String()); m != "" {
			return m
		}
	}
	for _, group := range [][]*istiosecurityv1.PeerAuthentication{nsDefault, rootDefault} {
		if len(group) == 0 {
			continue
		}
		if m := modeOf(oldest(group, meta).Spec.GetMtls().GetMode().String()); m != "" {
			return m
		}
	}
	return MTLSPermissive
}

func modeOf(s string) MTLSMode {
	switch MTLSMode(s) {
	case MTLSPermissive, MTLSStrict, MTLSDisable:
		return MTLSMode(s)
	}
	return ""
}
