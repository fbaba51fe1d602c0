package configsource

import (
	"testing"

	"github.com/embark-mesh/embark/translate/endpoints"
)

// TestEndpointIndexReuse: the index is reused while no indexed object
// changed, built again after a change, not remembered when a change came
// while it was built (its objects may predate it), and never reused while
// Run does not watch.
func TestEndpointIndexReuse(t *testing.T) {
	var e endpointIndex
	builds := 0
	build := func() *endpoints.Index { builds++; return endpoints.NewIndex(nil, nil, nil) }
	get := func() *endpoints.Index { return e.index(e.generation(), build) }

	get()
	get()
	if builds != 2 {
		t.Fatalf("not watching: %d builds for 2 translations, want 2", builds)
	}

	e.watch(true)
	builds = 0
	a := get()
	if b := get(); b != a || builds != 1 {
		t.Fatalf("watching, nothing changed: %d builds, same index %v; want 1 and the same", builds, b == a)
	}
	e.changed()
	c := get()
	if c == a || builds != 2 {
		t.Fatalf("after a change: %d builds, same index %v; want 2 and a new one", builds, c == a)
	}

	// A change while the index is built: used once, not remembered.
	e.changed()
	gen := e.generation()
	d := e.index(gen, func() *endpoints.Index { e.changed(); return build() })
	if f := get(); f == d || f == c || builds != 4 {
		t.Fatalf("after a change during the build: %d builds; want 4 and a new index", builds)
	}

	e.watch(false)
	builds = 0
	get()
	get()
	if builds != 2 {
		t.Fatalf("no longer watching: %d builds for 2 translations, want 2", builds)
	}
}
