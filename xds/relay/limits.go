package relay

import (
	"sync/atomic"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of Limits.
const (
	// DefaultMaxNamesPerType bounds the resource names one stream subscribes
	// to per type. A sidecar subscribes by name to what it reaches (EDS: one
	// cluster per service port, RDS: one route configuration per port);
	// wildcard types (CDS, LDS) carry one name or none.
	DefaultMaxNamesPerType = 10_000
	// DefaultMaxNameBytesPerStream bounds the bytes of every name (and
	// Delta initial_resource_versions entry) one stream subscribes to, over
	// all its types: about 20,000 EDS cluster names of 50 bytes, and a
	// quarter of istiod's 4 MiB message limit, so that the one request that
	// restores a SotW type's subscription on a new upstream stream (which
	// cannot be split) always fits.
	DefaultMaxNameBytesPerStream = 1 << 20
	// MaxNameBytesPerStreamLimit is the largest MaxNameBytesPerStream:
	// half of istiod's default message limit.
	MaxNameBytesPerStreamLimit = 2 << 20
	// DefaultMaxRequestBytes is the largest request the relay sends istiod
	// when it restores a stream's subscriptions: istiod's default limit on a
	// received message (ISTIO_GPRC_MAXRECVMSGSIZE, 4 MiB).
	DefaultMaxRequestBytes = 4 << 20
)

// Limits bound what one stream may subscribe to. The zero value of a field
// means its default.
type Limits struct {
	// MaxNamesPerType bounds the resource names subscribed to per type URL
	// (SotW: the names of the type's latest request; Delta: the names
	// subscribed and not unsubscribed, and the initial_resource_versions
	// of the type's first request). Default DefaultMaxNamesPerType.
	MaxNamesPerType int
	// MaxNameBytesPerStream bounds the bytes of those names over all the
	// stream's types. Default DefaultMaxNameBytesPerStream.
	MaxNameBytesPerStream int
}

func (l *Limits) setDefaults() {
	if l.MaxNamesPerType <= 0 {
		l.MaxNamesPerType = DefaultMaxNamesPerType
	}
	if l.MaxNameBytesPerStream <= 0 {
		l.MaxNameBytesPerStream = DefaultMaxNameBytesPerStream
	}
}

// Subscriptions are one stream's subscriptions, kept within Limits. The
// relay keeps one per relayed stream; the standalone server keeps one per
// stream in front of go-control-plane, so both modes refuse the same
// requests.
type Subscriptions[Req any] interface {
	// Observe applies a request of the sidecar, or refuses it with
	// ResourceExhausted (naming the type and the limit) and keeps nothing
	// of it.
	Observe(*Req) error
	// Names is how many names are subscribed to.
	Names() int
	// Release forgets every subscription (the stream ended).
	Release()
}

// NewSotwSubscriptions returns the subscriptions of a SotW stream; total,
// when not nil, counts the names it holds (with other streams').
func NewSotwSubscriptions(l Limits, total *atomic.Int64) Subscriptions[discovery.DiscoveryRequest] {
	return newSotwState(l, total)
}

// NewDeltaSubscriptions returns the subscriptions of a Delta stream; see
// NewSotwSubscriptions.
func NewDeltaSubscriptions(l Limits, total *atomic.Int64) Subscriptions[discovery.DeltaDiscoveryRequest] {
	return newDeltaState(l, total)
}

// usage is what one stream's subscriptions hold: names and their bytes,
// checked against its limits, and added to total (the relay's count over
// every stream; nil: not counted).
type usage struct {
	limits Limits
	names  int
	bytes  int
	total  *atomic.Int64
}

func newUsage(l Limits, total *atomic.Int64) usage {
	l.setDefaults()
	return usage{limits: l, total: total}
}

// check refuses a change of the stream's names to typeNames names of
// typeURL and dBytes more bytes over the stream.
func (u *usage) check(typeURL string, typeNames, dBytes int) error {
	if typeNames > u.limits.MaxNamesPerType {
		return status.Errorf(codes.ResourceExhausted, "subscription to %d resource names of type %s exceeds the limit of %d names per type (limits.xds.maxSubscribedNamesPerType)",
			typeNames, typeURL, u.limits.MaxNamesPerType)
	}
	if b := u.bytes + dBytes; b > u.limits.MaxNameBytesPerStream {
		return status.Errorf(codes.ResourceExhausted, "subscription to type %s brings the stream's resource names to %d bytes, over the limit of %d bytes per stream (limits.xds.maxSubscribedNameBytesPerStream)",
			typeURL, b, u.limits.MaxNameBytesPerStream)
	}
	return nil
}

// add records dNames more names of dBytes more bytes.
func (u *usage) add(dNames, dBytes int) {
	u.names += dNames
	u.bytes += dBytes
	if u.total != nil {
		u.total.Add(int64(dNames))
	}
}

// release takes the stream's names out of the total.
func (u *usage) release() {
	u.add(-u.names, -u.bytes)
}

// nameBytes is the bytes of names.
func nameBytes(names []string) int {
	n := 0
	for _, s := range names {
		n += len(s)
	}
	return n
}
