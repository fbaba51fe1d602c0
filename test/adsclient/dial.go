package adsclient

import (
	"context"
	"crypto/tls"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// DialOption changes how Dial connects.
type DialOption func(*dialOptions)

type dialOptions struct {
	creds credentials.TransportCredentials
	extra []grpc.DialOption
}

// WithTLS makes Dial connect over TLS with cfg instead of plaintext.
func WithTLS(cfg *tls.Config) DialOption {
	return func(o *dialOptions) { o.creds = credentials.NewTLS(cfg) }
}

// WithCredentials makes Dial connect with creds instead of plaintext.
func WithCredentials(creds credentials.TransportCredentials) DialOption {
	return func(o *dialOptions) { o.creds = creds }
}

// WithGRPCOptions adds gRPC dial options, e.g. a custom dialer.
func WithGRPCOptions(opts ...grpc.DialOption) DialOption {
	return func(o *dialOptions) { o.extra = append(o.extra, opts...) }
}

// Dial returns a client connection to addr, plaintext unless an option says
// otherwise. The caller closes it.
func Dial(addr string, opts ...DialOption) (*grpc.ClientConn, error) {
	o := dialOptions{creds: insecure.NewCredentials()}
	for _, opt := range opts {
		opt(&o)
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(o.creds)}, o.extra...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// WithToken returns ctx carrying token as the bearer token of the calls made
// with it, as a sidecar presents its token; an empty token adds nothing.
func WithToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}
