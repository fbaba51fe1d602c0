package configsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/translate"
	"github.com/embark-mesh/embark/translate/endpoints"
	"github.com/embark-mesh/embark/xds/internal/snapcache"
)

// scopes remembers the translation of each scope (translate.ScopeKey) while
// the inputs do not change, so that the proxies of one scope are translated
// once per change, not once each. Only while Run watches the inputs: without
// its change events a remembered translation could be stale, so every
// configuration is translated afresh.
type scopes struct {
	mu sync.Mutex
	// watching is set while Run's event handlers are registered.
	watching bool
	// gen counts the changes of the inputs Run has seen.
	gen uint64
	// entries are the translations of generation entriesGen.
	entries    map[string]*scopeEntry
	entriesGen uint64
}

// scopeEntry is one scope's translation, computed by the first proxy that
// needs it; the others wait for ready.
type scopeEntry struct {
	ready chan struct{}
	t     *scopeTranslation
	err   error
}

// changed says the inputs changed: the translations remembered so far are
// not reused.
func (s *scopes) changed() {
	s.mu.Lock()
	s.gen++
	s.mu.Unlock()
}

// watch turns remembering on (Run's handlers are registered) or off.
func (s *scopes) watch(on bool) {
	s.mu.Lock()
	s.watching = on
	s.gen++
	s.entries = nil
	s.mu.Unlock()
}

// get returns the scope's translation of the current inputs, computing it
// with translate unless another proxy did since the last change. The
// generation is read before translate reads the inputs, so a change the
// translation may have missed always makes the next get translate again.
func (s *scopes) get(ctx context.Context, key string, translate func() (*scopeTranslation, error)) (*scopeTranslation, error) {
	for {
		s.mu.Lock()
		if !s.watching {
			s.mu.Unlock()
			return translate()
		}
		if s.entries == nil || s.entriesGen != s.gen {
			s.entries, s.entriesGen = map[string]*scopeEntry{}, s.gen
		}
		if e, ok := s.entries[key]; ok {
			s.mu.Unlock()
			select {
			case <-e.ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if e.err == nil {
				return e.t, nil
			}
			continue // the proxy that translated failed to read the inputs: try again
		}
		e := &scopeEntry{ready: make(chan struct{})}
		s.entries[key] = e
		gen := s.gen
		s.mu.Unlock()

		e.t, e.err = translate()
		if e.err != nil {
			s.mu.Lock()
			if s.entriesGen == gen && s.entries[key] == e {
				delete(s.entries, key)
			}
			s.mu.Unlock()
		}
		close(e.ready)
		return e.t, e.err
	}
}

// scopeTranslation is a scope's shared translation, validated and hashed.
type scopeTranslation struct {
	shared *translate.Shared
	// invalid is why a shared resource does not validate (nil: all do).
	invalid error
	// types are the shared resources of each of servedTypes, with their
	// digest (nil: none of the type).
	types [len(servedTypes)]*sharedType
	// parts are the digests of the messages the proxies' own resources
	// share.
	parts sharedParts
}

// sharedType are the shared resources of one type.
type sharedType struct {
	digest  []byte
	version string // of the type for a proxy with none of its own
	set     *snapcache.Set
}

// servedTypes are the types of a proxy's snapshot.
var servedTypes = [...]resource.Type{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// translateScope reads the inputs every workload reads alike, adds them to
// in (the scope's inputs for its first proxy), translates the scope,
// validates and hashes the shared resources.
func (s *Source) translateScope(ctx context.Context, in *translate.Inputs) (*scopeTranslation, error) {
	gen := s.endpoints.generation() // before the inputs are read
	full := *in
	if err := s.serviceInputs(ctx, &full); err != nil {
		return nil, err
	}
	// The indexed objects are read only to build the index: translation
	// reads them through it (translate.Inputs.Endpoints).
	idx, err := s.endpoints.index(gen, func() (*endpoints.Index, error) {
		var eps translate.Inputs
		if err := s.endpointInputs(ctx, &eps); err != nil {
			return nil, err
		}
		return endpoints.NewIndex(eps.EndpointSlices, eps.Pods, eps.WorkloadEntries), nil
	})
	if err != nil {
		return nil, err
	}
	full.Endpoints = idx
	if m := s.opts.Metrics; m != nil {
		m.translations.Inc()
	}
	t := &scopeTranslation{shared: translate.Prepare(&full)}
	common := t.shared.Common()
	if common == nil {
		return t, nil // For returns the error
	}
	t.invalid = common.Validate()
	parts, err := newSharedParts(t.shared.Parts())
	if err != nil {
		t.invalid = err
		return t, nil
	}
	t.parts = parts
	byType := common.ByType()
	for i, typ := range servedTypes {
		rs := byType[typ]
		d, err := digest(typ, rs, nil)
		if err != nil {
			t.invalid = err
			return t, nil
		}
		t.types[i] = &sharedType{digest: d, version: hex.EncodeToString(d)[:16], set: snapcache.NewSet(typ, rs)}
	}
	return t, nil
}

// snapshot is the configuration of a proxy of the scope whose own resources
// are own: each type's shared set (one for the scope, encoded once for all
// its proxies) and the proxy's own set; the type's version hashes the
// shared digest and, when the proxy has resources of its own of that type,
// theirs.
func (t *scopeTranslation) snapshot(own *ownParts) (*snapcache.Snapshot, error) {
	snap := snapcache.NewSnapshot()
	for i, typ := range servedTypes {
		st := t.types[i]
		if st == nil { // none of the type
			st = emptyTypes[i]
		}
		mine := own.types[i]
		if len(mine.resources) == 0 {
			if err := snap.SetType(typ, st.version, st.set); err != nil {
				return nil, err
			}
			continue
		}
		for _, name := range mine.set.Names() {
			if st.set.Has(name) {
				return nil, fmt.Errorf("%s %q is both shared by the scope and the workload's own", typ, name)
			}
		}
		h := sha256.New()
		h.Write(st.digest)
		h.Write(mine.digest)
		if err := snap.SetType(typ, hex.EncodeToString(h.Sum(nil))[:16], st.set, mine.set); err != nil {
			return nil, err
		}
	}
	return snap, nil
}

// emptyTypes are servedTypes with no resources (the digest of nothing, see
// digest).
var emptyTypes = func() (out [len(servedTypes)]*sharedType) {
	d := sha256.Sum256(nil)
	for i, typ := range servedTypes {
		out[i] = &sharedType{digest: d[:], version: hex.EncodeToString(d[:])[:16], set: snapcache.NewSet(typ, nil)}
	}
	return out
}()

// endpointIndex is the endpoints.Index the scopes' translations share while
// the objects it indexes (EndpointSlices, Pods, WorkloadEntries) do not
// change: a Sidecar, Service or policy change translates the scopes again
// without scanning every WorkloadEntry and pod for each port again. Only
// while Run watches the inputs, as scopes.
type endpointIndex struct {
	mu       sync.Mutex
	watching bool
	// gen counts the changes of the indexed objects Run has seen.
	gen uint64
	// idx was built from the objects of generation idxGen.
	idx    *endpoints.Index
	idxGen uint64
}

// changed says an indexed object changed: the index is built again.
func (e *endpointIndex) changed() {
	e.mu.Lock()
	e.gen++
	e.mu.Unlock()
}

// watch turns reuse on (Run's handlers are registered) or off.
func (e *endpointIndex) watch(on bool) {
	e.mu.Lock()
	e.watching = on
	e.gen++
	e.idx = nil
	e.mu.Unlock()
}

// generation is the current generation, read before the objects are.
func (e *endpointIndex) generation() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// index returns the index of generation gen: the remembered one if it is
// of gen and nothing changed since, else build's (which reads the objects),
// remembered if nothing changed since gen.
func (e *endpointIndex) index(gen uint64, build func() (*endpoints.Index, error)) (*endpoints.Index, error) {
	e.mu.Lock()
	if e.watching && e.idx != nil && e.idxGen == gen && e.gen == gen {
		idx := e.idx
		e.mu.Unlock()
		return idx, nil
	}
	e.mu.Unlock()
	idx, err := build()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.watching && e.gen == gen {
		e.idx, e.idxGen = idx, gen
	}
	e.mu.Unlock()
	return idx, nil
}
