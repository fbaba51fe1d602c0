package registry

import (
	"testing"

	istiometa "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

func TestWorkloadEntryHealthAndTraffic(t *testing.T) {
	enabled := map[string]string{AnnotationHealthChecksEnabled: "true"}
	cond := func(status string) []*istiometa.IstioCondition {
		return []*istiometa.IstioCondition{{Type: "Other", Status: "False"}, {Type: ConditionHealthy, Status: status}}
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
