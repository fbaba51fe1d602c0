package revision_test

import (
	"testing"

	"github.com/embark-mesh/embark/xds/revision"
)

// Choose picks a workload's revision as Istio's injection webhooks pick a
// pod's: namespace labels first, the group's label only in a namespace
// without either.
func TestChoose(t *testing.T) {
	tests := []struct {
		name      string
		ns, group map[string]string
		want      string
	}{
		{name: "no labels: default"},
		{name: "namespace revision", ns: map[string]string{"istio.io/rev": "canary"}, want: "canary"},
		{name: "namespace default revision", ns: map[string]string{"istio.io/rev": "default"}, want: ""},
		{name: "group revision in an unlabelled namespace", group: map[string]string{"istio.io/rev": "canary"}, want: "canary"},
		{name: "namespace revision wins over the group's", ns: map[string]string{"istio.io/rev": "stable"}, group: map[string]string{"istio.io/rev": "canary"}, want: "stable"},
		{name: "istio-injection=enabled wins over the namespace revision", ns: map[string]string{"istio-injection": "enabled", "istio.io/rev": "canary"}, want: ""},
		{name: "istio-injection=enabled wins over the group revision", ns: map[string]string{"istio-injection": "enabled"}, group: map[string]string{"istio.io/rev": "canary"}, want: ""},
		{name: "group default revision", group: map[string]string{"istio.io/rev": "default"}, want: ""},
		{name: "other labels ignored", ns: map[string]string{"team": "a"}, group: map[string]string{"app": "ratings"}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := revision.Choose(tt.ns, tt.group); got != tt.want {
				t.Errorf("Choose(%v, %v) = %q, want %q", tt.ns, tt.group, got, tt.want)
			}
		})
	}
}
