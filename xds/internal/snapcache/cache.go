package snapcache

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// Cache holds each node's snapshot and answers its state-of-the-world
// watches. Delta watches, and the snapshot and status reads, are inner's
// (go-control-plane's SnapshotCache), which is given every snapshot too.
// Nodes are identified by their ID (cache.IDHash).
type Cache struct {
	inner cache.SnapshotCache
	log   *slog.Logger

	mu      sync.RWMutex
	nodes   map[string]*node
	watchID atomic.Int64
}

// node is one node's snapshot and open state-of-the-world watches.
type node struct {
	mu      sync.Mutex
	snap    *Snapshot // nil until one is set
	watches map[int64]watch
}

// watch is an open state-of-the-world watch: the request it answers, the
// stream's subscription of its type and the stream's response channel.
type watch struct {
	req *cache.Request
	sub cache.Subscription
	out chan cache.Response
}

// New returns a cache whose delta watches inner answers; log gets the
// watches' debug logs.
func New(inner cache.SnapshotCache, log *slog.Logger) *Cache {
	return &Cache{inner: inner, log: log, nodes: map[string]*node{}}
}

func noop() {}

// node returns id's node, made if missing.
func (c *Cache) node(id string) *node {
	c.mu.RLock()
	n := c.nodes[id]
	c.mu.RUnlock()
	if n != nil {
		return n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n = c.nodes[id]; n == nil {
		n = &node{watches: map[int64]watch{}}
		c.nodes[id] = n
	}
	return n
}

// SetSnapshot sets id's snapshot and answers its open watches whose type's
// version it changes.
func (c *Cache) SetSnapshot(ctx context.Context, id string, snap cache.ResourceSnapshot) error {
	s := FromResourceSnapshot(snap)
	if err := c.inner.SetSnapshot(ctx, id, snap); err != nil {
		return err
	}
	n := c.node(id)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.snap = s
	for wid, w := range n.watches {
		if s.GetVersion(w.req.GetTypeUrl()) == w.req.GetVersionInfo() {
			continue
		}
		if err := c.respond(ctx, id, w, s); err != nil {
			return err
		}
		delete(n.watches, wid)
	}
	return nil
}

// GetSnapshot returns id's snapshot as it was set.
func (c *Cache) GetSnapshot(id string) (cache.ResourceSnapshot, error) {
	return c.inner.GetSnapshot(id)
}

// ClearSnapshot forgets id's snapshot and open watches (which are not
// answered).
func (c *Cache) ClearSnapshot(id string) {
	c.inner.ClearSnapshot(id)
	c.mu.Lock()
	delete(c.nodes, id)
	c.mu.Unlock()
}

// GetStatusKeys returns the IDs of the nodes the cache holds anything of.
func (c *Cache) GetStatusKeys() []string {
	keys := c.inner.GetStatusKeys()
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		seen[k] = true
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	for k := range c.nodes {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	return keys
}

// CreateWatch implements cache.ConfigWatcher: it answers at once when the
// node's snapshot has another version of the type than the request's, or
// resources of the subscription the stream was not sent yet; else it waits
// for a snapshot that changes the type's version.
func (c *Cache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	id := req.GetNode().GetId()
	n := c.node(id)
	n.mu.Lock()
	defer n.mu.Unlock()
	w := watch{req: req, sub: sub, out: out}
	if n.snap != nil && stale(n.snap.typed(req.GetTypeUrl()), req, sub) {
		return noop, c.respond(context.Background(), id, w, n.snap)
	}
	wid := c.watchID.Add(1)
	n.watches[wid] = w
	if c.log.Enabled(context.Background(), slog.LevelDebug) {
		c.log.Debug("open watch", "node", id, "type", req.GetTypeUrl(), "version", req.GetVersionInfo(), "watch", wid)
	}
	return func() {
		n.mu.Lock()
		delete(n.watches, wid)
		n.mu.Unlock()
	}, nil
}

// CreateDeltaWatch implements cache.ConfigWatcher (inner's).
func (c *Cache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	return c.inner.CreateDeltaWatch(req, sub, out)
}

// stale says whether a stream holding sub, asking req, lacks what t holds:
// another version, or a resource it subscribes to (all, when wildcard) that
// it was not sent.
func stale(t typeSets, req *cache.Request, sub cache.Subscription) bool {
	if req.GetVersionInfo() != t.version {
		return true
	}
	known := sub.ReturnedResources()
	if !sub.IsWildcard() {
		for name := range sub.SubscribedResources() {
			if _, ok := known[name]; !ok && t.has(name) {
				return true
			}
		}
		return false
	}
	for _, set := range t.sets {
		for _, name := range set.names {
			if _, ok := known[name]; !ok {
				return true
			}
		}
	}
	return false
}

// respond sends w the snapshot's resources of its type: those the request
// names, or all when it names none.
func (c *Cache) respond(ctx context.Context, id string, w watch, s *Snapshot) error {
	t := s.typed(w.req.GetTypeUrl())
	r := &response{req: w.req, version: t.version, sets: t.sets, returned: map[string]string{}}
	if names := w.req.GetResourceNames(); len(names) > 0 {
		r.only = make(map[string]bool, len(names))
		for _, name := range names {
			r.only[name] = true
		}
	}
	for _, set := range t.sets {
		for _, name := range set.names {
			if r.only == nil || r.only[name] {
				r.returned[name] = t.version
			}
		}
	}
	if c.log.Enabled(ctx, slog.LevelDebug) {
		c.log.Debug("respond", "node", id, "type", w.req.GetTypeUrl(), "requested", w.req.GetResourceNames(), "request version", w.req.GetVersionInfo(), "version", t.version, "resources", len(r.returned))
	}
	select {
	case w.out <- r:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// response is a state-of-the-world response of a snapshot's sets, their
// encodings shared with every other response of the same sets.
type response struct {
	req      *cache.Request
	version  string
	sets     []*Set
	only     map[string]bool // nil: every resource of sets
	returned map[string]string
}

var _ cache.Response = (*response)(nil)

// GetDiscoveryResponse implements cache.Response. Each call returns a new
// DiscoveryResponse (the server sets its nonce) whose resources are the
// sets' shared encodings: callers must not modify them.
func (r *response) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	resources := make([]*anypb.Any, 0, len(r.returned))
	for _, set := range r.sets {
		encoded, err := set.encoded()
		if err != nil {
			return nil, err
		}
		if r.only == nil {
			resources = append(resources, encoded...)
			continue
		}
		for i, name := range set.names {
			if r.only[name] {
				resources = append(resources, encoded[i])
			}
		}
	}
	return &discovery.DiscoveryResponse{VersionInfo: r.version, Resources: resources, TypeUrl: r.req.GetTypeUrl()}, nil
}

// GetRequest implements cache.Response.
func (r *response) GetRequest() *discovery.DiscoveryRequest { return r.req }

// GetVersion implements cache.Response.
func (r *response) GetVersion() (string, error) { return r.version, nil }

// GetResponseVersion implements cache.Response.
func (r *response) GetResponseVersion() string { return r.version }

// GetReturnedResources implements cache.Response: a new map per response
// (the stream's subscription keeps and changes it).
func (r *response) GetReturnedResources() map[string]string { return r.returned }

// GetContext implements cache.Response.
func (r *response) GetContext() context.Context { return context.Background() }
