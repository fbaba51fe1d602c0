package xds

import (
	"cmp"
	"slices"
)

// Proxies returns the proxies with at least one stream on this server, one
// per node ID, ordered by node ID. A ConfigSource uses it to find the
// proxies a change affects, then calls Refresh for their workloads.
func (s *Server) Proxies() []*Proxy {
	s.mu.Lock()
	seen := map[string]*Proxy{}
	for _, set := range s.byWorkload {
		for _, st := range set {
			if _, ok := seen[st.proxy.NodeID]; !ok {
				seen[st.proxy.NodeID] = st.proxy
			}
		}
	}
	s.mu.Unlock()
	out := make([]*Proxy, 0, len(seen))
	for _, p := range seen {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Proxy) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return out
}
