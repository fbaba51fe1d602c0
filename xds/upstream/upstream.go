// Package upstream dials istiod from the onboarding endpoint: one gRPC
// client connection to istiod's secure port (15012 in a cluster), verified
// with istiod's root certificates (a PEM file, read again when it changes, so
// a rotated root is used without a restart) and istiod's server name, with
// keepalive and a bounded reconnect backoff. The connection carries no
// credential of its own: each call sends the credential of the workload it
// acts for (the sidecar's bearer token), as istiod authenticates every proxy
// and certificate request by its caller.
//
// The certificate relay (package xds/ca) and the xDS relay use it.
package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// Defaults of Options.
const (
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
	DefaultBackoffMax       = 30 * time.Second
	DefaultRootRecheck      = 10 * time.Second
	// DefaultMaxMessageSize bounds a message istiod sends (a large mesh's
	// configuration): 64 MiB.
	DefaultMaxMessageSize = 64 << 20
	// DefaultConnWindowSize is the connection's HTTP/2 flow-control window
	// (16 MiB): every relayed stream shares the one connection to istiod,
	// and with HTTP/2's 64 KiB a push to thousands of streams waited a
	// round trip of window updates per 64 KiB for all of them together,
	// where sidecars connected straight to istiod have a window each.
	DefaultConnWindowSize = 16 << 20
	// DefaultStreamWindowSize is each stream's window (HTTP/2's initial
	// 65,535 bytes), static: what a slow sidecar's stream may hold unread
	// in Embark.
	DefaultStreamWindowSize = 65535
)

// Options configures Dial. Every field documents its default.
type Options struct {
	// Address of istiod's secure gRPC port, host:port. Required.
	Address string
	// ServerName is the DNS name istiod's serving certificate must carry
	// (Istio's istiod.istio-system.svc). Default: the host of Address.
	ServerName string
	// RootCertFile is a PEM file of the roots istiod's serving certificate
	// chains to (the istio-ca-root-cert ConfigMap's root-cert.pem). It is
	// read at Dial (an unreadable or empty file fails Dial) and again, at
	// most every RootRecheck, when its modification time or size changed;
	// a bad new file is logged and the last good roots stay in use.
	// Required unless Plaintext.
	RootCertFile string
	// RootRecheck is the least time between two checks of RootCertFile.
	// Default 10s.
	RootRecheck time.Duration
	// Plaintext dials without TLS: istiod's plaintext port, for tests only.
	// Default false.
	Plaintext bool
	// KeepaliveTime is how long the connection may be idle before a ping.
	// Default 30s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long a ping may go unanswered before the
	// connection is closed. Default 10s.
	KeepaliveTimeout time.Duration
	// Backoff between reconnection attempts: gRPC's default (1s doubling,
	// jitter 0.2) capped at BackoffMax.
	BackoffMax time.Duration
	// MaxMessageSize bounds a received message. Default 64 MiB.
	MaxMessageSize int
	// ConnWindowSize is the connection-level flow-control window istiod
	// may fill before Embark acknowledges what it received, shared by every
	// relayed stream. Default DefaultConnWindowSize (16 MiB); at least
	// 65,535 bytes.
	ConnWindowSize int32
	// StreamWindowSize is each stream's flow-control window: what istiod
	// may send one relayed stream ahead of the sidecar reading it, so what
	// a slow sidecar's stream may hold in Embark. Static (gRPC's estimate
	// of the bandwidth-delay product, which would grow it up to 16 MiB per
	// stream, is off). Default DefaultStreamWindowSize (65,535 bytes,
	// HTTP/2's initial window); at least that.
	StreamWindowSize int32
	// Metrics records the connection's state and the roots' expiry.
	// Default: not recorded.
	Metrics *Metrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// DialOptions are appended to Dial's own (interceptors, stats handlers).
	DialOptions []grpc.DialOption
}

func (o *Options) setDefaults() error {
	if o.Address == "" {
		return errors.New("upstream: Address is required")
	}
	host, _, err := net.SplitHostPort(o.Address)
	if err != nil {
		return fmt.Errorf("upstream: address %q: %w", o.Address, err)
	}
	if o.ServerName == "" {
		o.ServerName = host
	}
	if !o.Plaintext && o.RootCertFile == "" {
		return errors.New("upstream: RootCertFile is required (istiod's root certificates)")
	}
	if o.RootRecheck <= 0 {
		o.RootRecheck = DefaultRootRecheck
	}
	if o.KeepaliveTime <= 0 {
		o.KeepaliveTime = DefaultKeepaliveTime
	}
	if o.KeepaliveTimeout <= 0 {
		o.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = DefaultMaxMessageSize
	}
	if o.ConnWindowSize == 0 {
		o.ConnWindowSize = DefaultConnWindowSize
	}
	if o.StreamWindowSize == 0 {
		o.StreamWindowSize = DefaultStreamWindowSize
	}
	if o.ConnWindowSize < DefaultStreamWindowSize || o.StreamWindowSize < DefaultStreamWindowSize {
		return fmt.Errorf("upstream: ConnWindowSize %d and StreamWindowSize %d must be at least %d bytes", o.ConnWindowSize, o.StreamWindowSize, DefaultStreamWindowSize)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Dial returns a client connection to istiod. It does not wait for the
// connection to be established: it connects at once and again, with gRPC's
// backoff, whenever the connection breaks (keepConnected); it fails only on
// bad options or an unreadable
// root file. ctx bounds nothing but reading the roots; the caller closes the
// connection.
func Dial(ctx context.Context, opts Options) (*grpc.ClientConn, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if !opts.Plaintext {
		roots, err := NewRoots(opts.RootCertFile, opts.RootRecheck, opts.Logger)
		if err != nil {
			return nil, err
		}
		roots.metrics = opts.Metrics
		opts.Metrics.rootsLoaded(roots.expiry)
		creds = credentials.NewTLS(roots.ClientConfig(opts.ServerName))
	}
	bo := backoff.DefaultConfig
	bo.MaxDelay = opts.BackoffMax
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: opts.KeepaliveTime, Timeout: opts.KeepaliveTimeout, PermitWithoutStream: true,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 20 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMessageSize)),
		// Static windows: a large one for the connection every relayed
		// stream shares, HTTP/2's for each stream.
		grpc.WithStaticConnWindowSize(opts.ConnWindowSize),
		grpc.WithStaticStreamWindowSize(opts.StreamWindowSize),
	}
	dialOpts = append(dialOpts, opts.DialOptions...)
	conn, err := grpc.NewClient(opts.Address, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("upstream: dial istiod at %s: %w", opts.Address, err)
	}
	go keepConnected(context.WithoutCancel(ctx), conn, opts.Metrics)
	return conn, nil
}

// Roots holds root certificates read from a PEM file, read again when the
// file changes.
type Roots struct {
	file    string
	recheck time.Duration
	log     *slog.Logger
	now     func() time.Time
	metrics *Metrics // set by Dial before the roots are shared

	mu      sync.Mutex
	pool    *x509.CertPool
	expiry  time.Time // the earliest NotAfter of pool's certificates
	modTime time.Time
	size    int64
	checked time.Time
}

// NewRoots reads file, which must hold at least one PEM certificate.
func NewRoots(file string, recheck time.Duration, log *slog.Logger) (*Roots, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &Roots{file: file, recheck: recheck, log: log, now: time.Now}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("upstream: istiod root certificates: %w", err)
	}
	pool, expiry, err := readPool(file)
	if err != nil {
		return nil, err
	}
	r.pool, r.expiry, r.modTime, r.size, r.checked = pool, expiry, fi.ModTime(), fi.Size(), r.now()
	return r, nil
}

// Pool returns the current roots, reading the file again when it changed
// and the last check is at least the recheck interval ago.
func (r *Roots) Pool() *x509.CertPool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checked) < r.recheck {
		return r.pool
	}
	r.checked = now
	fi, err := os.Stat(r.file)
	if err != nil {
		r.log.Warn("istiod root certificates unreadable; keeping the last good ones", "file", r.file, "error", err)
		return r.pool
	}
	if fi.ModTime().Equal(r.modTime) && fi.Size() == r.size {
		return r.pool
	}
	pool, expiry, err := readPool(r.file)
	if err != nil {
		r.log.Warn("istiod root certificates changed but are invalid; keeping the last good ones", "file", r.file, "error", err)
		return r.pool
	}
	r.log.Info("istiod root certificates reloaded", "file", r.file)
	r.pool, r.expiry, r.modTime, r.size = pool, expiry, fi.ModTime(), fi.Size()
	r.metrics.rootsLoaded(expiry)
	return r.pool
}

// ClientConfig returns a TLS 1.2+ client configuration that verifies the
// server's chain against the current roots and its name against serverName.
// (Go's verification is done by hand here only so that the roots can change
// between handshakes; it is the same x509 verification.)
func (r *Roots) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         serverName,
		NextProtos:         []string{"h2"},
		InsecureSkipVerify: true, // verified in VerifyConnection against Pool()
		VerifyConnection: func(cs tls.ConnectionState) error {
			return r.verify(cs, serverName)
		},
	}
}

func (r *Roots) verify(cs tls.ConnectionState, serverName string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("istiod presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: r.Pool(), Intermediates: inter, DNSName: serverName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("verify istiod's certificate (server name %s) against the roots in %s: %w", serverName, r.file, err)
	}
	return nil
}

// readPool reads the PEM certificates of file, and the earliest time one
// of them expires.
func readPool(file string) (*x509.CertPool, time.Time, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("upstream: istiod root certificates: %w", err)
	}
	pool := x509.NewCertPool()
	var expiry time.Time
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			continue // AppendCertsFromPEM skips it too
		}
		pool.AddCert(c)
		if expiry.IsZero() || c.NotAfter.Before(expiry) {
			expiry = c.NotAfter
		}
	}
	if expiry.IsZero() {
		return nil, time.Time{}, fmt.Errorf("upstream: istiod root certificates %s: no PEM certificate", file)
	}
	return pool, expiry, nil
}
