// Package snapcache answers state-of-the-world xDS watches from per-node
// snapshots built of sets of resources that many nodes share, encoding each
// set once for every stream it is sent on.
//
// go-control-plane's SnapshotCache encodes every resource of a response for
// each response (cache.RawResponse), so a scope's shared listeners are
// encoded again for each of its thousands of proxies on every push. Here a
// Set is encoded once, on its first send, and its encoded resources
// (immutable anypb.Any messages) are carried by every response that holds
// it; a node's own resources form a set of their own, kept as long as they
// do not change. The watch protocol (when a watch is answered, what a
// response returns) follows go-control-plane's SnapshotCache in non-ADS
// mode; delta watches are go-control-plane's.
package snapcache

import (
	"fmt"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// Set is resources of one type that any number of snapshots may hold. Its
// resources must not be modified once it is made.
type Set struct {
	typeURL   string
	resources []types.Resource
	names     []string

	// anys are the resources' deterministic encodings (as
	// cache.MarshalResource's), made on first use (encodeErr: why not).
	encodeOnce sync.Once
	anys       []*anypb.Any
	encodeErr  error
	// index holds the names, made on first use by Has on a large set.
	indexOnce sync.Once
	index     map[string]struct{}
}

// NewSet returns the set of resources, all of type typeURL.
func NewSet(typeURL string, resources []types.Resource) *Set {
	s := &Set{typeURL: typeURL, resources: resources, names: make([]string, len(resources))}
	for i, r := range resources {
		s.names[i] = cache.GetResourceName(r)
	}
	return s
}

// encoded returns the resources encoded, encoding them on the first call.
func (s *Set) encoded() ([]*anypb.Any, error) {
	s.encodeOnce.Do(func() {
		anys := make([]*anypb.Any, len(s.resources))
		for i, r := range s.resources {
			b, err := cache.MarshalResource(r)
			if err != nil {
				s.encodeErr = fmt.Errorf("marshal %s %q: %w", s.typeURL, s.names[i], err)
				return
			}
			anys[i] = &anypb.Any{TypeUrl: s.typeURL, Value: b}
		}
		s.anys = anys
	})
	return s.anys, s.encodeErr
}

// Names are the names of the set's resources, in its order. Read-only.
func (s *Set) Names() []string { return s.names }

// Has says whether the set holds a resource named name.
func (s *Set) Has(name string) bool {
	if len(s.names) < 8 { // a scan is cheaper than a map
		for _, n := range s.names {
			if n == name {
				return true
			}
		}
		return false
	}
	s.indexOnce.Do(func() {
		s.index = make(map[string]struct{}, len(s.names))
		for _, n := range s.names {
			s.index[n] = struct{}{}
		}
	})
	_, ok := s.index[name]
	return ok
}

// Snapshot is a node's configuration: for each type, a version and the sets
// of its resources (whose names must differ). It implements
// cache.ResourceSnapshot for delta streams and readers; those views are made
// on demand. Build it with SetType before handing it over; it is immutable
// afterwards.
type Snapshot struct {
	byType [types.UnknownType]typeSets

	// versions are ConstructVersionMap's, made on first use.
	versionsOnce sync.Once
	versions     map[string]map[string]string
	versionsErr  error
}

// typeSets are a snapshot's resources of one type.
type typeSets struct {
	version string
	sets    []*Set
}

var _ cache.ResourceSnapshot = (*Snapshot)(nil)

// NewSnapshot returns a snapshot with no resources of any type (and an
// empty version for each).
func NewSnapshot() *Snapshot { return &Snapshot{} }

// SetType sets typeURL's version and resources.
func (s *Snapshot) SetType(typeURL, version string, sets ...*Set) error {
	i := cache.GetResponseType(typeURL)
	if i == types.UnknownType {
		return fmt.Errorf("unknown resource type %q", typeURL)
	}
	for _, set := range sets {
		if set.typeURL != typeURL {
			return fmt.Errorf("a set of %s given as %s", set.typeURL, typeURL)
		}
	}
	s.byType[i] = typeSets{version: version, sets: sets}
	return nil
}

// FromResourceSnapshot returns snap as a Snapshot: itself if it is one,
// else one set per type holding the type's resources (TTLs are not kept:
// the server sends no heartbeats).
func FromResourceSnapshot(snap cache.ResourceSnapshot) *Snapshot {
	if s, ok := snap.(*Snapshot); ok {
		return s
	}
	out := NewSnapshot()
	for i := range out.byType {
		typeURL, err := cache.GetResponseTypeURL(types.ResponseType(i))
		if err != nil {
			continue
		}
		rs, version := snap.GetResources(typeURL), snap.GetVersion(typeURL)
		if len(rs) == 0 && version == "" {
			continue // as the zero typeSets
		}
		list := make([]types.Resource, 0, len(rs))
		for _, r := range rs {
			list = append(list, r)
		}
		out.byType[i] = typeSets{version: version, sets: []*Set{NewSet(typeURL, list)}}
	}
	return out
}

func (s *Snapshot) typed(typeURL string) typeSets {
	i := cache.GetResponseType(typeURL)
	if i == types.UnknownType {
		return typeSets{}
	}
	return s.byType[i]
}

// has says whether the snapshot holds a resource of typeURL named name.
func (t typeSets) has(name string) bool {
	for _, set := range t.sets {
		if set.Has(name) {
			return true
		}
	}
	return false
}

// GetVersion implements cache.ResourceSnapshot.
func (s *Snapshot) GetVersion(typeURL string) string { return s.typed(typeURL).version }

// GetResourcesAndTTL implements cache.ResourceSnapshot.
func (s *Snapshot) GetResourcesAndTTL(typeURL string) map[string]types.ResourceWithTTL {
	t := s.typed(typeURL)
	out := map[string]types.ResourceWithTTL{}
	for _, set := range t.sets {
		for i, r := range set.resources {
			out[set.names[i]] = types.ResourceWithTTL{Resource: r}
		}
	}
	return out
}

// GetResources implements cache.ResourceSnapshot.
func (s *Snapshot) GetResources(typeURL string) map[string]types.Resource {
	t := s.typed(typeURL)
	out := map[string]types.Resource{}
	for _, set := range t.sets {
		for i, r := range set.resources {
			out[set.names[i]] = r
		}
	}
	return out
}

// ConstructVersionMap implements cache.ResourceSnapshot: each resource's
// version is the hash of its encoding (as go-control-plane's).
func (s *Snapshot) ConstructVersionMap() error {
	s.versionsOnce.Do(func() { s.versions, s.versionsErr = s.buildVersionMap() })
	return s.versionsErr
}

// GetVersionMap implements cache.ResourceSnapshot.
func (s *Snapshot) GetVersionMap(typeURL string) map[string]string {
	if s.ConstructVersionMap() != nil {
		return nil
	}
	return s.versions[typeURL]
}

func (s *Snapshot) buildVersionMap() (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	for i, t := range s.byType {
		typeURL, err := cache.GetResponseTypeURL(types.ResponseType(i))
		if err != nil {
			return nil, err
		}
		versions := map[string]string{}
		for _, set := range t.sets {
			encoded, err := set.encoded()
			if err != nil {
				return nil, err
			}
			for j, a := range encoded {
				versions[set.names[j]] = cache.HashResource(a.GetValue())
			}
		}
		out[typeURL] = versions
	}
	return out, nil
}
