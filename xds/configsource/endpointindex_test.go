package configsource

import (
	"errors"
	"testing"

	"github.com/embark-mesh/embark/translate/endpoints"
)

// TestEndpointIndexReuse: the index is reused while no indexed object
// changed, built again after a change, not remembered when a change came
// while it was built (its objects may predate it) or when the build failed,
// and never reused while Run does not watch.
func TestEndpointIndexReuse(t *testing.T) {
	var e endpointIndex
	builds := 0
	build := func() (*endpoints.Index, error) { builds++; return endpoints.NewIndex(nil, nil, nil), nil }
	get := func() *endpoints.Index {
		idx, err := e.index(e.generation(), build)
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}

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
	d, _ := e.index(gen, func() (*endpoints.Index, error) { e.changed(); return build() })
	if f := get(); f == d || f == c || builds != 4 {
		t.Fatalf("after a change during the build: %d builds; want 4 and a new index", builds)
	}

	// A build that fails to read the objects: its error, nothing
	// remembered.
	e.changed()
	builds = 0
	if _, err := e.index(e.generation(), func() (*endpoints.Index, error) { builds++; return nil, errors.New("cache not readable") }); err == nil {
		t.Fatal("a failed build returned no error")
	}
	if get(); builds != 2 {
		t.Fatalf("after a failed build: %d builds, want 2 (nothing remembered)", builds)
	}

	e.watch(false)
	builds = 0
	get()
	get()
	if builds != 2 {
		t.Fatalf("no longer watching: %d builds for 2 translations, want 2", builds)
	}
}
