package relay

import (
	"maps"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
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
}

type sotwSub struct {
	typeURL string
	names   []string
	version string
}

func newSotwState() *sotwState { return &sotwState{} }

func (s *sotwState) node(r *sotwReq) *core.Node       { return r.GetNode() }
func (s *sotwState) setNode(r *sotwReq, n *core.Node) { r.Node = n }
func (s *sotwState) nonce(r *sotwResp) *string        { return &r.Nonce }
func (s *sotwState) sent(*sotwResp)                   {}

func (s *sotwState) observe(r *sotwReq) {
	i := slices.IndexFunc(s.subs, func(sub sotwSub) bool { return sub.typeURL == r.GetTypeUrl() })
	if i < 0 {
		s.subs = append(s.subs, sotwSub{typeURL: r.GetTypeUrl()})
		i = len(s.subs) - 1
	}
	s.subs[i].names = r.GetResourceNames()
	s.subs[i].version = r.GetVersionInfo()
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

func (s *sotwState) resync() []*sotwReq {
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
}

type deltaSub struct {
	names    map[string]struct{}
	versions map[string]string // accepted resource versions
	pending  []deltaPending    // responses not yet ACKed, oldest first
}

type deltaPending struct {
	nonce   string
	updated map[string]string
	removed []string
}

func newDeltaState() *deltaState { return &deltaState{subs: map[string]*deltaSub{}} }

func (s *deltaState) node(r *deltaReq) *core.Node       { return r.GetNode() }
func (s *deltaState) setNode(r *deltaReq, n *core.Node) { r.Node = n }
func (s *deltaState) nonce(r *deltaResp) *string        { return &r.Nonce }

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

func (s *deltaState) observe(r *deltaReq) {
	sub, created := s.sub(r.GetTypeUrl())
	if created {
		maps.Copy(sub.versions, r.GetInitialResourceVersions())
	}
	for _, n := range r.GetResourceNamesSubscribe() {
		sub.names[n] = struct{}{}
	}
	for _, n := range r.GetResourceNamesUnsubscribe() {
		delete(sub.names, n)
		delete(sub.versions, n)
	}
	if n := r.GetResponseNonce(); n != "" {
		sub.answered(n, r.GetErrorDetail() == nil)
	}
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

func (s *deltaState) resync() []*deltaReq {
	out := make([]*deltaReq, 0, len(s.order))
	for _, t := range s.order {
		sub := s.subs[t]
		out = append(out, &deltaReq{
			TypeUrl:                 t,
			ResourceNamesSubscribe:  slices.Sorted(maps.Keys(sub.names)),
			InitialResourceVersions: maps.Clone(sub.versions),
		})
	}
	return out
}
