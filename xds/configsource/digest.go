package configsource

import (
	"crypto/sha256"
	"fmt"
	"strconv"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// sharedParts are the digests of the messages a scope's proxies' own
// resources share (translate.Shared.Parts: ingress filter chains, inbound
// clusters), by pointer: each is hashed once per scope, not once per
// workload. Read-only once built; the messages it holds are immutable and
// stay reachable through it, so a pointer names one content for the map's
// lifetime.
type sharedParts map[proto.Message][sha256.Size]byte

// newSharedParts hashes chains and clusters.
func newSharedParts(chains []*listenerv3.FilterChain, clusters []*clusterv3.Cluster) (sharedParts, error) {
	out := make(sharedParts, len(chains)+len(clusters))
	add := func(m proto.Message, name string) error {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return fmt.Errorf("marshal %s: %w", name, err)
		}
		out[m] = sha256.Sum256(b)
		return nil
	}
	for _, c := range chains {
		if err := add(c, "filter chain "+c.GetName()); err != nil {
			return nil, err
		}
	}
	for _, c := range clusters {
		if err := add(c, "cluster "+c.GetName()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// digest is the SHA-256 of resources of type t sorted by name: each one's
// name and encoding (see encode), length-prefixed. Equal resources have
// equal digests; a change of any field changes it.
func digest(t resource.Type, rs []types.Resource, parts sharedParts) ([]byte, error) {
	h := sha256.New()
	var buf, head []byte // reused: one encoding buffer for all resources
	for _, r := range rs {
		var err error
		buf, err = encode(buf[:0], r, parts)
		if err != nil {
			return nil, fmt.Errorf("marshal %s %q: %w", t, cache.GetResourceName(r), err)
		}
		name := cache.GetResourceName(r)
		// "<len(name)>:<name><len(encoding)>:"
		head = strconv.AppendInt(head[:0], int64(len(name)), 10)
		head = append(append(head, ':'), name...)
		head = append(strconv.AppendInt(head, int64(len(buf)), 10), ':')
		h.Write(head)
		h.Write(buf)
	}
	return h.Sum(nil), nil
}

// Encoding forms, the first byte of encode's output.
const (
	// formPlain: the resource's deterministic protobuf encoding.
	formPlain = 'p'
	// formShared: a resource parts holds, by its digest.
	formShared = 's'
	// formChains: a listener's deterministic encoding without its filter
	// chains, length-prefixed, then each chain in order: 'd' and its
	// digest when parts holds it, else 'e', its encoding's length and its
	// encoding.
	formChains = 'c'
)

// encode appends r's encoding to buf. A resource of parts is encoded as
// its digest, and a listener holding filter chains of parts with their
// digests in their place, so hashing a workload's own resources costs
// their own fields, not the scope's parts (the bulk of them) again.
func encode(buf []byte, r types.Resource, parts sharedParts) ([]byte, error) {
	det := proto.MarshalOptions{Deterministic: true}
	if d, ok := parts[r]; ok {
		return append(append(buf, formShared), d[:]...), nil
	}
	l, ok := r.(*listenerv3.Listener)
	if !ok || len(parts) == 0 || !holdsShared(l, parts) {
		return det.MarshalAppend(append(buf, formPlain), r)
	}
	buf = append(buf, formChains)
	shell, err := det.Marshal(withoutChains(l))
	if err != nil {
		return nil, err
	}
	buf = strconv.AppendInt(buf, int64(len(shell)), 10)
	buf = append(append(buf, ':'), shell...)
	for _, c := range l.GetFilterChains() {
		if d, ok := parts[c]; ok {
			buf = append(append(buf, 'd'), d[:]...)
			continue
		}
		b, err := det.Marshal(c)
		if err != nil {
			return nil, err
		}
		buf = strconv.AppendInt(append(buf, 'e'), int64(len(b)), 10)
		buf = append(append(buf, ':'), b...)
	}
	return buf, nil
}

// holdsShared says whether one of l's filter chains is in parts.
func holdsShared(l *listenerv3.Listener, parts sharedParts) bool {
	for _, c := range l.GetFilterChains() {
		if _, ok := parts[c]; ok {
			return true
		}
	}
	return false
}

// filterChainsField is Listener.filter_chains.
var filterChainsField = (&listenerv3.Listener{}).ProtoReflect().Descriptor().Fields().ByName("filter_chains")

// withoutChains is a new listener with every populated field of l but its
// filter chains. Its fields' values are l's own (not copies): read it only.
func withoutChains(l *listenerv3.Listener) proto.Message {
	m := l.ProtoReflect()
	shell := m.New()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd != filterChainsField {
			shell.Set(fd, v)
		}
		return true
	})
	return shell.Interface()
}
