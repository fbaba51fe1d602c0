package translate

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"hash"
	"maps"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"
)

// OwnInputs are what For(w) reads, in a form cheap to compare: the workload,
// a digest of the rest of the scope's translation For reads (the mesh
// settings, the root namespace, the selected Sidecar's name and ingress
// listeners, the scope's ingress filter chains with the protocol, port and
// mTLS mode each was built for, its TLS inspector and inbound clusters,
// egress's error) and which of the egress listeners' addresses w's ingress
// listeners would take too. Two Shared, of any inputs, whose OwnInputs for
// a workload are Equal give it equal own results of For (or equal errors):
// a caller may keep a workload's own resources, checked and hashed, while
// they stay Equal.
type OwnInputs struct {
	scope    [sha256.Size]byte
	workload Workload
	// conflicts are the indexes of the claims w's ingress listeners take.
	conflicts []int
}

// Equal says whether a and b are the same inputs.
func (a OwnInputs) Equal(b OwnInputs) bool {
	wa, wb := a.workload, b.workload
	return a.scope == b.scope && wa.Name == wb.Name && wa.Namespace == wb.Namespace &&
		wa.Address == wb.Address && wa.ServiceAccount == wb.ServiceAccount &&
		maps.Equal(wa.Labels, wb.Labels) && slices.Equal(a.conflicts, b.conflicts)
}

// OwnInputs returns w's OwnInputs; ok is false when they could not be
// taken (a part does not encode): keep nothing then.
func (s *Shared) OwnInputs(w Workload) (in OwnInputs, ok bool) {
	if !s.ownInputsOK {
		return in, false
	}
	in = OwnInputs{scope: s.ownInputs, workload: w}
	// For fails on the first claim an ingress listener of w takes.
	if len(s.claims) > 0 && s.sidecar != nil {
		for i, c := range s.claims {
			for _, ing := range s.sidecar.Spec.GetIngress() {
				bind := ing.GetBind()
				if bind == "" {
					bind = w.Address
				}
				if c.port == ing.GetPort().GetNumber() && c.ip == bind {
					in.conflicts = append(in.conflicts, i)
					break
				}
			}
		}
	}
	return in, true
}

// fieldWriter writes length-prefixed fields to h.
func fieldWriter(h hash.Hash) func(string) {
	return func(v string) {
		h.Write(strconv.AppendInt(nil, int64(len(v)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(v))
	}
}

// ownInputsDigest computes the digest of OwnInputs, the same for every
// workload of the scope: of what Prepare built for For.
func (s *Shared) ownInputsDigest() ([sha256.Size]byte, bool) {
	h := sha256.New()
	field := fieldWriter(h)
	field("embark.translate.own/v1")
	field(s.in.Mesh.TrustDomain)
	field(s.in.Mesh.ClusterID)
	field(s.in.Mesh.DomainSuffix)
	field(s.root)
	field(s.trust)
	field(s.suffix)
	if s.sidecar == nil {
		field("no sidecar")
		return [sha256.Size]byte(h.Sum(nil)), true
	}
	field(s.sidecar.Namespace + "/" + s.sidecar.Name)
	ingress := s.sidecar.Spec.GetIngress()
	field(strconv.Itoa(len(ingress)))
	for _, ing := range ingress {
		if !message(field, ing) {
			return [sha256.Size]byte{}, false
		}
	}
	keys := make([]inboundChainKey, 0, len(s.chains))
	for k := range s.chains {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b inboundChainKey) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port), cmp.Compare(a.mode, b.mode))
	})
	field(strconv.Itoa(len(keys)))
	for _, k := range keys {
		field(fmt.Sprintf("%s|%d|%s|%d", k.proto, k.port, k.mode, len(s.chains[k])))
		for _, c := range s.chains[k] {
			if !message(field, c) {
				return [sha256.Size]byte{}, false
			}
		}
	}
	if s.inbound != nil {
		if !message(field, s.inbound.tlsInspector) {
			return [sha256.Size]byte{}, false
		}
		field(strconv.Itoa(len(s.inbound.clusters)))
		for _, c := range s.inbound.clusters {
			if c == nil {
				field("none")
				continue
			}
			if !message(field, c) {
				return [sha256.Size]byte{}, false
			}
		}
	}
	// The claims' addresses matter to For only where a workload's ingress
	// listeners take them too (OwnInputs.conflicts), so an egress bind may
	// change without changing the digest.
	field(strconv.Itoa(len(s.claims)))
	for _, c := range s.claims {
		field(c.field)
	}
	if s.err != nil {
		field("error: " + s.err.Error())
	}
	return [sha256.Size]byte(h.Sum(nil)), true
}

// message adds m's deterministic encoding as a field.
func message(field func(string), m proto.Message) bool {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return false
	}
	field(string(b))
	return true
}
