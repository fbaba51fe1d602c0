package endpoints

import (
	"testing"

	metav1alpha1 "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

func TestWorkloadEntryHealth(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		condition   string // "" means no Healthy condition
		want        bool
	}{
		{name: "no condition", want: true},
		{name: "healthy", condition: "True", want: true},
		{name: "unhealthy", condition: "False", want: false},
		{name: "checks enabled, not reported yet", annotations: map[string]string{HealthChecksAnnotation: "true"}, want: false},
		{name: "checks enabled, healthy", annotations: map[string]string{HealthChecksAnnotation: "true"}, condition: "True", want: true},
		{name: "checks enabled, unhealthy", annotations: map[string]string{HealthChecksAnnotation: "true"}, condition: "False", want: false},
		{name: "checks disabled explicitly", annotations: map[string]string{HealthChecksAnnotation: "false"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			we := &istionetworkingv1.WorkloadEntry{}
			we.Annotations = tt.annotations
			if tt.condition != "" {
				we.Status.Conditions = append(we.Status.Conditions, &metav1alpha1.IstioCondition{Type: HealthyCondition, Status: tt.condition})
			}
			if got := Healthy(we); got != tt.want {
				t.Errorf("Healthy = %v, want %v", got, tt.want)
			}
		})
	}
}
