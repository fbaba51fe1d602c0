package relay

import (
	"maps"
	"slices"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// maxPending bounds the Delta responses kept until the sidecar ACKs them;
// beyond it the oldest is taken as accepted.
const maxPending = 16

type (
	sotwReq   = discovery.DiscoveryRequest
	sotwResp  = discovery.DiscoveryResponse
	deltaReq  = discovery.DeltaDiscoveryRequest
	deltaResp = discovery.DeltaDiscoveryResponse
)

var (
	_ protocol[sotwReq, sotwResp]   = (*sotwState)(nil)
	_ protocol[deltaReq, deltaResp] = (*deltaState)(nil)
)

// sotwState is a SotW stream's subscriptions: per type, in the order the
// sidecar first asked for them, the resource names of its latest request and
// the version it last accepted (a request's version_info). A stream asks for
// a handful of types (the server refuses others), so a slice holds them.
type sotwState struct {
	subs []sotwSub
	use  usage
}

type sotwSub struct {
	typeURL string
	names   []string
	bytes   int // of names
	version string
}

func newSotwState(l Limits, total *atomic.Int64) *sotwState {
	return &sotwState{use: newUsage(l, total)}
}

func (s *sotwState) node(r *sotwReq) *core.Node       { return r.GetNode() }
func (s *sotwState) setNode(r *sotwReq, n *core.Node) { r.Node = n }
func (s *sotwState) nonce(r *sotwResp) *string        { return &r.Nonce }
func (s *sotwState) typeURL(r *sotwResp) string       { return r.GetTypeUrl() }
func (s *sotwState) sent(*sotwResp)                   {}

// Observe implements Subscriptions: a SotW request replaces its type's
// names.
func (s *sotwState) Observe(r *sotwReq) error {
	i := slices.IndexFunc(s.subs, func(sub sotwSub) bool { return sub.typeURL == r.GetTypeUrl() })
	names := r.GetResourceNames()
	b := nameBytes(names)
	old, oldBytes := 0, 0
	if i >= 0 {
		old, oldBytes = len(s.subs[i].names), s.subs[i].bytes
	}
	if err := s.use.check(r.GetTypeUrl(), len(names), b-oldBytes); err != nil {
		return err
	}
	if i < 0 {
		s.subs = append(s.subs, sotwSub{typeURL: r.GetTypeUrl()})
		i = len(s.subs) - 1
	}
	s.use.add(len(names)-old, b-oldBytes)
	s.subs[i].names, s.subs[i].bytes = names, b
	s.subs[i].version = r.GetVersionInfo()
	return nil
}

// Names implements Subscriptions.
func (s *sotwState) Names() int { return s.use.names }

// Release implements Subscriptions.
func (s *sotwState) Release() {
	s.use.release()
	s.subs = nil
}

// upstream relays a request with the upstream nonce it answers. An answer to
// an earlier upstream stream is dropped: the resynchronisation carried the
// sidecar's subscription, and istiod would ignore the unknown nonce anyway;
// the sidecar's answer to the new stream's response carries its names again.
func (s *sotwState) upstream(r *sotwReq, gen uint64) bool {
	if r.GetResponseNonce() == "" {
		return true
	}
	g, n, ok := parseNonce(r.GetResponseNonce())
	if !ok || g != gen {
		return false
	}
	r.ResponseNonce = n
	return true
}

// resync is one request per type: a SotW request names the type's whole
// subscription, so it cannot be split; Limits keep it under the message
// limit (MaxNameBytesPerStreamLimit).
func (s *sotwState) resync(int, int) []*sotwReq {
	out := make([]*sotwReq, 0, len(s.subs))
	for _, sub := range s.subs {
		out = append(out, &sotwReq{TypeUrl: sub.typeURL, ResourceNames: slices.Clone(sub.names), VersionInfo: sub.version})
	}
	return out
}

// deltaState is a Delta stream's subscriptions: per type, the names the
// sidecar subscribed to and the versions of the resources it accepted.
type deltaState struct {
	order []string
	subs  map[string]*deltaSub
	use   usage
}

type deltaSub struct {
	names    map[string]struct{}
	versions map[string]string // accepted resource versions
	pending  []deltaPending    // responses not yet ACKed, oldest first
	// initial is how many initial_resource_versions the sidecar sent with
	// the type's first request (counted against the limits as names).
	initial int
}

type deltaPending struct {
	nonce   string
	updated map[string]string
	removed []string
}

func newDeltaState(l Limits, total *atomic.Int64) *deltaState {
	return &deltaState{subs: map[string]*deltaSub{}, use: newUsage(l, total)}
}

func (s *deltaState) node(r *deltaReq) *core.Node       { return r.GetNode() }
func (s *deltaState) setNode(r *deltaReq, n *core.Node) { r.Node = n }
func (s *deltaState) nonce(r *deltaResp) *string        { return &r.Nonce }
func (s *deltaState) typeURL(r *deltaResp) string       { return r.GetTypeUrl() }

func (s *deltaState) sub(typeURL string) (*deltaSub, bool) {
	sub := s.subs[typeURL]
	if sub != nil {
		return sub, false
	}
	sub = &deltaSub{names: map[string]struct{}{}, versions: map[string]string{}}
	s.subs[typeURL] = sub
	s.order = append(s.order, typeURL)
	return sub, true
}

// Observe implements Subscriptions: a Delta request subscribes to and
// unsubscribes from names of its type; the type's first request may carry
// the versions the sidecar already has. A refused request is undone.
func (s *deltaState) Observe(r *deltaReq) error {
	t := r.GetTypeUrl()
	sub := s.subs[t]
	var (
		initial      = r.GetInitialResourceVersions()
		initialBytes int
		names        map[string]struct{}
	)
	if sub != nil {
		names = sub.names
		initial = nil // honoured on a type's first request only
	} else {
		names = map[string]struct{}{}
		for k, v := range initial {
			initialBytes += len(k) + len(v)
		}
	}
	// Apply the names (as istiod does: subscriptions, then
	// unsubscriptions), remembering what changed to undo a refusal.
	var added, removed []string
	dBytes := initialBytes
	for _, n := range r.GetResourceNamesSubscribe() {
		if _, ok := names[n]; !ok {
			names[n] = struct{}{}
			added = append(added, n)
			dBytes += len(n)
		}
	}
	for _, n := range r.GetResourceNamesUnsubscribe() {
		if _, ok := names[n]; ok {
			delete(names, n)
			removed = append(removed, n)
			dBytes -= len(n)
		}
	}
	if err := s.use.check(t, max(len(names), len(initial)), dBytes); err != nil {
		for _, n := range added {
			delete(names, n)
		}
		for _, n := range removed {
			names[n] = struct{}{}
		}
		return err
	}
	s.use.add(len(added)-len(removed)+len(initial), dBytes)
	if sub == nil {
		sub, _ = s.sub(t)
		sub.names, sub.initial = names, len(initial)
		maps.Copy(sub.versions, initial)
	}
	for _, n := range r.GetResourceNamesUnsubscribe() {
		delete(sub.versions, n)
	}
	if n := r.GetResponseNonce(); n != "" {
		sub.answered(n, r.GetErrorDetail() == nil)
	}
	return nil
}

// Names implements Subscriptions.
func (s *deltaState) Names() int { return s.use.names }

// Release implements Subscriptions.
func (s *deltaState) Release() {
	s.use.release()
	s.subs, s.order = map[string]*deltaSub{}, nil
}

// answered applies the response of nonce when it was accepted, and the older
// pending ones (the sidecar handles responses in order).
func (sub *deltaSub) answered(nonce string, accepted bool) {
	i := slices.IndexFunc(sub.pending, func(p deltaPending) bool { return p.nonce == nonce })
	if i < 0 {
		return
	}
	for _, p := range sub.pending[:i] {
		sub.apply(p)
	}
	if accepted {
		sub.apply(sub.pending[i])
	}
	sub.pending = slices.Clone(sub.pending[i+1:])
}

func (sub *deltaSub) apply(p deltaPending) {
	maps.Copy(sub.versions, p.updated)
	for _, n := range p.removed {
		delete(sub.versions, n)
	}
}

func (s *deltaState) sent(r *deltaResp) {
	sub, _ := s.sub(r.GetTypeUrl())
	p := deltaPending{nonce: r.GetNonce(), updated: make(map[string]string, len(r.GetResources())), removed: r.GetRemovedResources()}
	for _, res := range r.GetResources() {
		p.updated[res.GetName()] = res.GetVersion()
	}
	sub.pending = append(sub.pending, p)
	if len(sub.pending) > maxPending {
		sub.apply(sub.pending[0])
		sub.pending = slices.Clone(sub.pending[1:])
	}
}

// upstream relays a request with the upstream nonce it answers. An answer to
// an earlier upstream stream is dropped unless it changes the subscription,
// which is then relayed as a spontaneous request (istiod would drop a stale
// nonce with its subscription change).
func (s *deltaState) upstream(r *deltaReq, gen uint64) bool {
	if r.GetResponseNonce() == "" {
		return true
	}
	if g, n, ok := parseNonce(r.GetResponseNonce()); ok && g == gen {
		r.ResponseNonce = n
		return true
	}
	if len(r.GetResourceNamesSubscribe())+len(r.GetResourceNamesUnsubscribe()) == 0 {
		return false
	}
	r.ResponseNonce, r.ErrorDetail = "", nil
	return true
}

// resync restores each type's subscription: its names and the versions the
// sidecar accepted, in as many requests of the type as it takes to keep each
// within maxBytes (the first request's budget less reserve, the node it
// carries). Each name goes with its version; the first request of a type
// carries names first, so a subscription by name is never mistaken for a
// wildcard one, and every later request subscribes to names istiod has not
// seen on this stream yet, so istiod takes each as a subscription change.
func (s *deltaState) resync(maxBytes, reserve int) []*deltaReq {
	var out []*deltaReq
	budget := maxBytes - reserve
	for _, t := range s.order {
		sub := s.subs[t]
		c := newDeltaChunker(t, budget, maxBytes)
		for _, n := range slices.Sorted(maps.Keys(sub.names)) {
			v, ok := sub.versions[n]
			c.add(n, v, ok)
		}
		for _, n := range slices.Sorted(maps.Keys(sub.versions)) {
			if _, ok := sub.names[n]; !ok {
				c.addVersion(n, sub.versions[n])
			}
		}
		out = append(out, c.done()...)
		budget = maxBytes
	}
	return out
}

// deltaChunker splits one type's resynchronisation into requests of at most
// a budget of encoded bytes each (the first one's budget may be smaller).
type deltaChunker struct {
	typeURL  string
	budget   int // of the current request
	maxBytes int // of the later ones
	cur      *deltaReq
	size     int // encoded size of cur
	out      []*deltaReq
}

func newDeltaChunker(typeURL string, first, maxBytes int) *deltaChunker {
	c := &deltaChunker{typeURL: typeURL, budget: first, maxBytes: maxBytes}
	c.start()
	return c
}

func (c *deltaChunker) start() {
	c.cur = &deltaReq{TypeUrl: c.typeURL}
	c.size = fieldSize(len(c.typeURL))
}

// fit makes room for n more bytes, starting a new request when the current
// one holds something and would grow over its budget.
func (c *deltaChunker) fit(n int) {
	if c.size+n <= c.budget || (len(c.cur.ResourceNamesSubscribe) == 0 && len(c.cur.InitialResourceVersions) == 0) {
		return
	}
	c.out = append(c.out, c.cur)
	c.budget = c.maxBytes
	c.start()
}

// add adds a subscribed name and, when hasVersion, its version.
func (c *deltaChunker) add(name, version string, hasVersion bool) {
	n := fieldSize(len(name))
	if hasVersion {
		n += versionSize(name, version)
	}
	c.fit(n)
	c.cur.ResourceNamesSubscribe = append(c.cur.ResourceNamesSubscribe, name)
	c.size += fieldSize(len(name))
	if hasVersion {
		c.putVersion(name, version)
	}
}

// addVersion adds a version of a resource not subscribed to by name.
func (c *deltaChunker) addVersion(name, version string) {
	c.fit(versionSize(name, version))
	c.putVersion(name, version)
}

func (c *deltaChunker) putVersion(name, version string) {
	if c.cur.InitialResourceVersions == nil {
		c.cur.InitialResourceVersions = map[string]string{}
	}
	c.cur.InitialResourceVersions[name] = version
	c.size += versionSize(name, version)
}

func (c *deltaChunker) done() []*deltaReq {
	return append(c.out, c.cur)
}

// fieldSize is the encoded size of a length-delimited field of n bytes
// (field numbers below 16: a one-byte tag).
func fieldSize(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// versionSize is the encoded size of one initial_resource_versions entry.
func versionSize(name, version string) int {
	return fieldSize(fieldSize(len(name)) + fieldSize(len(version)))
}
