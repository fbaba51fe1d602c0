// Package syncstate records, per xDS type of one stream, what the server last
// sent and what the proxy acknowledged or refused, and reports it as the
// envoy.service.status.v3 generic xDS configs that `istioctl proxy-status`
// prints (SYNCED, STALE, ERROR, NOT_SENT). It holds no lock: the stream that
// owns a Types serialises its calls.
package syncstate

import (
	"slices"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// typeState is what a stream was sent of one type and what it acknowledged.
type typeState struct {
	typeURL      string
	sentNonce    string
	sentVersion  string
	ackedVersion string
	nacked       bool
	updated      time.Time
}

// Types is one stream's state per type asked for (a few: a slice, not a map).
// The zero value is ready to use.
type Types struct {
	types []typeState
}

// Requested records a request of typeURL answering nonce. When it NACKs the
// latest response, it returns that response's version.
func (t *Types) Requested(typeURL, nonce string, nack bool, now time.Time) (nackedVersion string, nacked bool) {
	ts := t.of(typeURL)
	if nonce == "" || nonce != ts.sentNonce {
		return "", false // a new subscription, or an answer to an older response
	}
	ts.nacked = nack
	if !nack {
		ts.ackedVersion = ts.sentVersion
	}
	ts.updated = now
	return ts.sentVersion, nack
}

// Sent records a response of typeURL.
func (t *Types) Sent(typeURL, nonce, version string, now time.Time) {
	ts := t.of(typeURL)
	ts.sentNonce, ts.sentVersion, ts.nacked, ts.updated = nonce, version, false, now
}

// of returns typeURL's state, added when new; the pointer is valid until the
// next call.
func (t *Types) of(typeURL string) *typeState {
	for i := range t.types {
		if t.types[i].typeURL == typeURL {
			return &t.types[i]
		}
	}
	t.types = append(t.types, typeState{typeURL: typeURL})
	return &t.types[len(t.types)-1]
}

// coreTypes are always reported, NOT_SENT when never sent.
var coreTypes = []string{resource.ClusterType, resource.ListenerType, resource.EndpointType, resource.RouteType}

// Configs reports each type's sync state, sorted by type URL; the four core
// types (CDS, LDS, EDS, RDS) are always there.
func (t *Types) Configs() []*statusv3.ClientConfig_GenericXdsConfig {
	byType := make(map[string]*typeState, len(t.types))
	typeURLs := make([]string, 0, len(t.types)+len(coreTypes))
	for i := range t.types {
		byType[t.types[i].typeURL] = &t.types[i]
		typeURLs = append(typeURLs, t.types[i].typeURL)
	}
	for _, u := range coreTypes {
		if _, ok := byType[u]; !ok {
			typeURLs = append(typeURLs, u)
		}
	}
	slices.Sort(typeURLs)
	out := make([]*statusv3.ClientConfig_GenericXdsConfig, 0, len(typeURLs))
	for _, u := range typeURLs {
		c := &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: u, ConfigStatus: statusv3.ConfigStatus_NOT_SENT}
		if ts := byType[u]; ts != nil && ts.sentNonce != "" {
			c.VersionInfo = ts.sentVersion
			c.LastUpdated = timestamppb.New(ts.updated)
			switch {
			case ts.nacked:
				c.ConfigStatus = statusv3.ConfigStatus_ERROR
			case ts.ackedVersion == ts.sentVersion:
				c.ConfigStatus = statusv3.ConfigStatus_SYNCED
			default:
				c.ConfigStatus = statusv3.ConfigStatus_STALE
			}
		}
		out = append(out, c)
	}
	return out
}
