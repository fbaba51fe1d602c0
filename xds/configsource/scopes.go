package configsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/translate"
)

// scopes remembers the translation of each scope (translate.ScopeKey) while
// the inputs do not change, so that the proxies of one scope are translated
// once per change, not once each; and likewise the objects of each
// namespace that may select a workload (what ScopeKey reads), so that they
// are listed once per namespace and change, not once per proxy. Only while
// Run watches the inputs: without its change events a remembered
// translation could be stale, so every configuration is translated afresh.
type scopes struct {
	mu sync.Mutex
	// watching is set while Run's event handlers are registered.
	watching bool
	// gen counts the changes of the inputs Run has seen.
	gen uint64
	// translations are the scopes' translations, selecting the namespaces'
	// selecting objects, of their generation.
	translations flight[*scopeTranslation]
	selecting    flight[*selecting]
}

// flight is what was computed, by key, in generation gen.
type flight[T any] struct {
	entries map[string]*scopeEntry[T]
	gen     uint64
}

// scopeEntry is one key's value, computed by the first proxy that needs it;
// the others wait for ready.
type scopeEntry[T any] struct {
	ready chan struct{}
	v     T
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
	s.translations.entries, s.selecting.entries = nil, nil
	s.mu.Unlock()
}

// get returns the scope's translation of the current inputs, computing it
// with translate unless another proxy did since the last change.
func (s *scopes) get(ctx context.Context, key string, translate func() (*scopeTranslation, error)) (*scopeTranslation, error) {
	return shared(ctx, s, &s.translations, key, translate)
}

// namespace returns the selecting objects of namespace ns as read since the
// last change, reading them with read unless another proxy did.
func (s *scopes) namespace(ctx context.Context, ns string, read func() (*selecting, error)) (*selecting, error) {
	return shared(ctx, s, &s.selecting, ns, read)
}

// shared returns f's value of key for the current inputs, computing it
// unless another proxy did since the last change. The generation is read
// before compute reads the inputs, so a change the computation may have
// missed always makes the next call compute again.
func shared[T any](ctx context.Context, s *scopes, f *flight[T], key string, compute func() (T, error)) (T, error) {
	for {
		s.mu.Lock()
		if !s.watching {
			s.mu.Unlock()
			return compute()
		}
		if f.entries == nil || f.gen != s.gen {
			f.entries, f.gen = map[string]*scopeEntry[T]{}, s.gen
		}
		if e, ok := f.entries[key]; ok {
			s.mu.Unlock()
			select {
			case <-e.ready:
			case <-ctx.Done():
				var zero T
				return zero, ctx.Err()
			}
			if e.err == nil {
				return e.v, nil
			}
			continue // the proxy that computed failed to read the inputs: try again
		}
		e := &scopeEntry[T]{ready: make(chan struct{})}
		f.entries[key] = e
		gen := s.gen
		s.mu.Unlock()

		e.v, e.err = compute()
		if e.err != nil {
			s.mu.Lock()
			if f.gen == gen && f.entries[key] == e {
				delete(f.entries, key)
			}
			s.mu.Unlock()
		}
		close(e.ready)
		return e.v, e.err
	}
}

// scopeTranslation is a scope's shared translation, validated and hashed.
type scopeTranslation struct {
	shared *translate.Shared
	// invalid is why a shared resource does not validate (nil: all do).
	invalid error
	// types are the shared resources of each type, with their digest.
	types map[resource.Type]*sharedType
}

// sharedType are the shared resources of one type.
type sharedType struct {
	digest []byte
	// resources are served as they are to a proxy with none of its own of
	// this type.
	resources cache.Resources
}

// served are the types of a proxy's snapshot.
var servedTypes = []resource.Type{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// translateScope reads the inputs every workload reads alike, adds them to
// in (the scope's inputs for its first proxy), translates the scope,
// validates and hashes the shared resources.
func (s *Source) translateScope(ctx context.Context, in *translate.Inputs) (*scopeTranslation, error) {
	full := *in
	if err := s.meshInputs(ctx, &full); err != nil {
		return nil, err
	}
	if m := s.opts.Metrics; m != nil {
		m.translations.Inc()
	}
	t := &scopeTranslation{shared: translate.Prepare(&full), types: map[resource.Type]*sharedType{}}
	common := t.shared.Common()
	if common == nil {
		return t, nil // For returns the error
	}
	t.invalid = common.Validate()
	for typ, rs := range common.ByType() {
		d, err := digest(typ, rs)
		if err != nil {
			t.invalid = err
			return t, nil
		}
		t.types[typ] = &sharedType{digest: d, resources: cache.NewResources(hex.EncodeToString(d)[:16], rs)}
	}
	return t, nil
}

// snapshot is the configuration of a proxy of the scope whose own resources
// are own (sorted by name, as translate returns them): each type's version hashes the shared digest and, when the proxy
// has resources of its own of that type, theirs.
func (t *scopeTranslation) snapshot(own *translate.Result) (*cache.Snapshot, error) {
	byType := own.ByType()
	snap := &cache.Snapshot{}
	for _, typ := range servedTypes {
		st := t.types[typ]
		if st == nil { // no Sidecar: an empty configuration
			st = &sharedType{}
			d, err := digest(typ, nil)
			if err != nil {
				return nil, err
			}
			st.digest, st.resources = d, cache.NewResources(hex.EncodeToString(d)[:16], nil)
		}
		mine := byType[typ]
		if len(mine) == 0 {
			snap.Resources[cache.GetResponseType(typ)] = st.resources
			continue
		}
		d, err := digest(typ, mine)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		h.Write(st.digest)
		h.Write(d)
		items := maps.Clone(st.resources.Items)
		if items == nil {
			items = map[string]types.ResourceWithTTL{}
		}
		for _, r := range mine {
			items[cache.GetResourceName(r)] = types.ResourceWithTTL{Resource: r}
		}
		snap.Resources[cache.GetResponseType(typ)] = cache.Resources{Version: hex.EncodeToString(h.Sum(nil))[:16], Items: items}
	}
	return snap, nil
}
