package presence

import (
	"strings"
	"testing"
	"unicode/utf8"

	istiometa "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/embark-mesh/embark/registry"
)

func TestWorkloadEntryHealthAndTraffic(t *testing.T) {
	enabled := map[string]string{registry.AnnotationHealthChecksEnabled: "true"}
	cond := func(status string) []*istiometa.IstioCondition {
		return []*istiometa.IstioCondition{{Type: "Other", Status: "False"}, {Type: registry.ConditionHealthy, Status: status}}
	}
	tests := []struct {
		name        string
		annotations map[string]string
		conditions  []*istiometa.IstioCondition
		wantHealth  string
		wantTraffic bool
	}{
		{name: "no probe", wantHealth: healthUnchecked, wantTraffic: true},
		{name: "probe, no report yet", annotations: enabled, wantHealth: healthUnhealthy, wantTraffic: false},
		{name: "probe passes", annotations: enabled, conditions: cond("True"), wantHealth: healthHealthy, wantTraffic: true},
		{name: "probe fails", annotations: enabled, conditions: cond("False"), wantHealth: healthUnhealthy, wantTraffic: false},
		{name: "only another condition", annotations: enabled, conditions: cond("True")[:1], wantHealth: healthUnhealthy, wantTraffic: false},
		{name: "failing report without the annotation: istiod still routes", conditions: cond("False"), wantHealth: healthUnhealthy, wantTraffic: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			we := &istionetworkingv1.WorkloadEntry{}
			we.Annotations = tt.annotations
			we.Status.Conditions = tt.conditions
			if got := WorkloadEntryHealth(we); got != tt.wantHealth {
				t.Errorf("WorkloadEntryHealth = %s, want %s", got, tt.wantHealth)
			}
			if got := ReceivesTraffic(we); got != tt.wantTraffic {
				t.Errorf("ReceivesTraffic = %v, want %v", got, tt.wantTraffic)
			}
		})
	}
}

// FuzzHealthMessage feeds the sidecar's error detail (outside input) to the
// message the conditions store.
func FuzzHealthMessage(f *testing.F) {
	f.Add("HTTP probe failed with statuscode: 503")
	f.Add("")
	f.Add(strings.Repeat("é", 600))
	f.Add(strings.Repeat("a", 1021) + "日本")
	f.Add("bad \xff utf-8")
	f.Fuzz(func(t *testing.T, msg string) {
		got := healthMessage(msg)
		if !utf8.ValidString(got) || len(got) > MaxHealthMessage {
			t.Fatalf("healthMessage(%q) = %q: %d bytes, valid UTF-8 %v", msg, got, len(got), utf8.ValidString(got))
		}
		if utf8.ValidString(msg) && len(msg) <= MaxHealthMessage && got != msg {
			t.Fatalf("a short valid message changed: %q -> %q", msg, got)
		}
		if len(msg) > MaxHealthMessage && utf8.ValidString(msg) && !strings.HasPrefix(msg, strings.TrimSuffix(got, "...")) {
			t.Fatalf("a long message is not cut from its start: %q", got)
		}
	})
}
