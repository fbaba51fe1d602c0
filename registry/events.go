package registry

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// NoEvents is the EventRecorder of a component given none: it records
// nothing. The endpoint always gives its components a real recorder; this
// keeps library users and tests that do not look at Events from needing one.
type NoEvents struct{}

var _ record.EventRecorder = NoEvents{}

// Event implements record.EventRecorder; it records nothing.
func (NoEvents) Event(runtime.Object, string, string, string) {}

// Eventf implements record.EventRecorder; it records nothing.
func (NoEvents) Eventf(runtime.Object, string, string, string, ...any) {}

// AnnotatedEventf implements record.EventRecorder; it records nothing.
func (NoEvents) AnnotatedEventf(runtime.Object, map[string]string, string, string, string, ...any) {
}
