// Package limits bounds what one client, and all clients together, can make
// the endpoint's servers hold: connections per source address, new RPCs
// (and HTTP requests) per source address per second, concurrent streams per
// connection, idle connections, keepalive pings and message sizes. The
// onboarding API, the xDS server and the local repository all take their
// limits from one Options; every default is documented on its field and in
// docs/onboarding-endpoint.md.
package limits

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Duration is a duration written as "10s" in the configuration file.
type Duration = metav1.Duration

// Options are the limits of one server. The zero value of every field means
// its default.
type Options struct {
	// MaxConnectionsPerSource is how many connections one source address
	// may hold open; more are closed at once. Default 64.
	MaxConnectionsPerSource int `json:"maxConnectionsPerSource,omitempty"`
	// MaxConnections is how many connections the server holds in all; more
	// are closed at once. Default 10000.
	MaxConnections int `json:"maxConnections,omitempty"`
	// RequestsPerSecondPerSource and RequestBurstPerSource are a token
	// bucket per source address for new RPCs (unary calls and streams) and
	// HTTP requests; a call over it fails ResourceExhausted (HTTP 429).
	// Default 20/s with a burst of 50.
	RequestsPerSecondPerSource float64 `json:"requestsPerSecondPerSource,omitempty"`
	RequestBurstPerSource      int     `json:"requestBurstPerSource,omitempty"`
	// MaxSources bounds how many source addresses are remembered (their
	// buckets and connection counts); the least recently seen idle one is
	// forgotten first. Default 65536.
	MaxSources int `json:"maxSources,omitempty"`
	// SourceExpiry is how long an idle source's bucket is kept. Default 10m.
	SourceExpiry *Duration `json:"sourceExpiry,omitempty"`
	// MaxConcurrentStreams is how many RPCs one gRPC connection may run at
	// once. Default 100.
	MaxConcurrentStreams uint32 `json:"maxConcurrentStreams,omitempty"`
	// FirstRequestTimeout is how long an xDS stream may wait for its first
	// request (the one that names the node) before it is closed
	// DeadlineExceeded. Default 10s.
	FirstRequestTimeout *Duration `json:"firstRequestTimeout,omitempty"`
	// MaxConnectionIdle closes a gRPC connection with no RPC for this long
	// (HTTP: the keep-alive idle timeout). Default 5m.
	MaxConnectionIdle *Duration `json:"maxConnectionIdle,omitempty"`
	// KeepaliveMinTime is the shortest interval between client keepalive
	// pings; a client pinging more often is disconnected (GOAWAY
	// too_many_pings). Pings without an active stream are allowed. Default
	// 15s (istiod's own policy; Istio's agent pings every 30s).
	KeepaliveMinTime *Duration `json:"keepaliveMinTime,omitempty"`
	// KeepaliveTime and KeepaliveTimeout: the server pings a connection
	// quiet for KeepaliveTime and closes it when the ping is not answered
	// within KeepaliveTimeout. Default 30s and 10s.
	KeepaliveTime    *Duration `json:"keepaliveTime,omitempty"`
	KeepaliveTimeout *Duration `json:"keepaliveTimeout,omitempty"`
	// MaxRecvMessageBytes is the largest message a client may send.
	// Default 4 MiB.
	MaxRecvMessageBytes int `json:"maxRecvMessageBytes,omitempty"`
	// MaxSubscribedNamesPerType bounds the resource names one xDS stream
	// subscribes to per type URL (SotW: a request's names; Delta: the names
	// subscribed and not unsubscribed); a request over it ends the stream
	// ResourceExhausted. xDS server only. Default 10000.
	MaxSubscribedNamesPerType int `json:"maxSubscribedNamesPerType,omitempty"`
	// MaxSubscribedNameBytesPerStream bounds the bytes of the resource names
	// (and Delta initial_resource_versions) one xDS stream subscribes to,
	// over all its types; a request over it ends the stream
	// ResourceExhausted. At most 2 MiB (half of istiod's message limit: the
	// relay restores a SotW type's subscription in one request). xDS server
	// only. Default 1 MiB.
	MaxSubscribedNameBytesPerStream int `json:"maxSubscribedNameBytesPerStream,omitempty"`
	// HTTPWriteTimeout is how long an HTTP response (a package download)
	// may take to write. Default 10m.
	HTTPWriteTimeout *Duration `json:"httpWriteTimeout,omitempty"`
	// HTTPReadHeaderTimeout is how long an HTTP client may take to send a
	// request's headers (and, over TLS, to finish the handshake); a slower
	// client (slowloris) is disconnected. Default 10s.
	HTTPReadHeaderTimeout *Duration `json:"httpReadHeaderTimeout,omitempty"`
}

// Defaults of Options.
const (
	DefaultMaxConnectionsPerSource    = 64
	DefaultMaxConnections             = 10000
	DefaultRequestsPerSecondPerSource = 20
	DefaultRequestBurstPerSource      = 50
	DefaultMaxSources                 = 65536
	DefaultSourceExpiry               = 10 * time.Minute
	DefaultMaxConcurrentStreams       = 100
	DefaultFirstRequestTimeout        = 10 * time.Second
	DefaultMaxConnectionIdle          = 5 * time.Minute
	DefaultKeepaliveMinTime           = 15 * time.Second
	DefaultKeepaliveTime              = 30 * time.Second
	DefaultKeepaliveTimeout           = 10 * time.Second
	DefaultMaxRecvMessageBytes        = 4 << 20
	DefaultHTTPWriteTimeout           = 10 * time.Minute
	DefaultHTTPReadHeaderTimeout      = 10 * time.Second
	// The subscription bounds are the relay's (xds/relay Limits), which
	// both modes enforce.
	DefaultMaxSubscribedNamesPerType       = 10_000
	DefaultMaxSubscribedNameBytesPerStream = 1 << 20
	MaxSubscribedNameBytesPerStream        = 2 << 20
)

// SetDefaults fills every zero field with its default.
func (o *Options) SetDefaults() {
	setInt(&o.MaxConnectionsPerSource, DefaultMaxConnectionsPerSource)
	setInt(&o.MaxConnections, DefaultMaxConnections)
	if o.RequestsPerSecondPerSource == 0 {
		o.RequestsPerSecondPerSource = DefaultRequestsPerSecondPerSource
	}
	setInt(&o.RequestBurstPerSource, DefaultRequestBurstPerSource)
	setInt(&o.MaxSources, DefaultMaxSources)
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	setInt(&o.MaxRecvMessageBytes, DefaultMaxRecvMessageBytes)
	setInt(&o.MaxSubscribedNamesPerType, DefaultMaxSubscribedNamesPerType)
	setInt(&o.MaxSubscribedNameBytesPerStream, DefaultMaxSubscribedNameBytesPerStream)
	setDuration(&o.SourceExpiry, DefaultSourceExpiry)
	setDuration(&o.FirstRequestTimeout, DefaultFirstRequestTimeout)
	setDuration(&o.MaxConnectionIdle, DefaultMaxConnectionIdle)
	setDuration(&o.KeepaliveMinTime, DefaultKeepaliveMinTime)
	setDuration(&o.KeepaliveTime, DefaultKeepaliveTime)
	setDuration(&o.KeepaliveTimeout, DefaultKeepaliveTimeout)
	setDuration(&o.HTTPWriteTimeout, DefaultHTTPWriteTimeout)
	setDuration(&o.HTTPReadHeaderTimeout, DefaultHTTPReadHeaderTimeout)
}

// Validate reports the first field that is out of range, by its JSON name.
func (o *Options) Validate() (field string, msg string, ok bool) {
	switch {
	case o.MaxConnectionsPerSource < 0:
		return "maxConnectionsPerSource", "must be positive", false
	case o.MaxConnections < 0:
		return "maxConnections", "must be positive", false
	case o.MaxConnectionsPerSource > o.MaxConnections:
		return "maxConnectionsPerSource", "must not exceed maxConnections", false
	case o.RequestsPerSecondPerSource < 0:
		return "requestsPerSecondPerSource", "must be positive", false
	case o.RequestBurstPerSource < 0:
		return "requestBurstPerSource", "must be positive", false
	case o.MaxSources < 0:
		return "maxSources", "must be positive", false
	case o.MaxRecvMessageBytes < 0:
		return "maxRecvMessageBytes", "must be positive", false
	case o.MaxSubscribedNamesPerType < 0:
		return "maxSubscribedNamesPerType", "must be positive", false
	case o.MaxSubscribedNameBytesPerStream < 0:
		return "maxSubscribedNameBytesPerStream", "must be positive", false
	case o.MaxSubscribedNameBytesPerStream > MaxSubscribedNameBytesPerStream:
		return "maxSubscribedNameBytesPerStream", "must be at most 2097152 (2 MiB, half of istiod's message limit)", false
	}
	for _, d := range []struct {
		name string
		d    *Duration
	}{
		{"sourceExpiry", o.SourceExpiry}, {"firstRequestTimeout", o.FirstRequestTimeout}, {"maxConnectionIdle", o.MaxConnectionIdle},
		{"keepaliveMinTime", o.KeepaliveMinTime}, {"keepaliveTime", o.KeepaliveTime}, {"keepaliveTimeout", o.KeepaliveTimeout},
		{"httpWriteTimeout", o.HTTPWriteTimeout}, {"httpReadHeaderTimeout", o.HTTPReadHeaderTimeout},
	} {
		if d.d != nil && d.d.Duration <= 0 {
			return d.name, "must be positive", false
		}
	}
	return "", "", true
}

func setInt(v *int, def int) {
	if *v == 0 {
		*v = def
	}
}

func setDuration(d **Duration, def time.Duration) {
	if *d == nil || (*d).Duration == 0 {
		*d = &Duration{Duration: def}
	}
}
