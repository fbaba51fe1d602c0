package watch

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

func TestDeleted(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	tests := []struct {
		name string
		obj  any
		want string // the object's name; "" for nil
	}{
		{name: "object", obj: pod, want: "p"},
		{name: "tombstone", obj: toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pod}, want: "p"},
		{name: "tombstone of no object", obj: toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: "junk"}},
		{name: "not an object", obj: 42},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Deleted(tt.obj)
			switch {
			case tt.want == "" && got != nil:
				t.Fatalf("Deleted = %v, want nil", got)
			case tt.want != "" && (got == nil || got.GetName() != tt.want):
				t.Fatalf("Deleted = %v, want %s", got, tt.want)
			}
		})
	}
}
