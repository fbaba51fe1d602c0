package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/onboarding/repository"
	"github.com/embark-mesh/embark/onboarding/repository/signing"
)

// repositoryServer is the local repository's HTTPS listener.
type repositoryServer struct {
	lis     net.Listener
	srv     *http.Server
	handler *repository.Handler
	tls     bool
}

// startRepository prepares the local repository's server on lis (the
// group's listen.repository) when localRepository is configured (nil
// otherwise). It serves with the endpoint's serving certificate (plaintext
// only with endpoint.plaintext). The signing key's expiry is reported on reg.
func startRepository(cfg *config.Configuration, lis net.Listener, servingTLS *tls.Config, lim *limits.Limiter, reg prometheus.Registerer, log *slog.Logger) (*repositoryServer, error) {
	if cfg.LocalRepository == nil {
		return nil, nil
	}
	var opts []repository.Option
	if f := cfg.LocalRepository.SigningKeyFile; f != "" {
		signer, err := loadSigner(f, cfg.LocalRepository.PublicKeyFiles)
		if err != nil {
			return nil, err
		}
		if err := signing.RegisterExpiry(reg, func() *signing.Signer { return signer }); err != nil {
			return nil, err
		}
		log.Info("local repository: apt and yum metadata signed", "key", signer.Fingerprint())
		opts = append(opts, repository.WithSigner(signer))
	} else {
		log.Warn("local repository: no localRepository.signingKeyFile: serving the packages without apt or yum metadata")
	}
	if v := cfg.LocalRepository.MetadataValidity; v != nil {
		opts = append(opts, repository.WithValidity(v.Duration))
	}
	if dirs := cfg.LocalRepository.ExtraDirectories; len(dirs) > 0 {
		opts = append(opts, repository.WithExtraDirectories(dirs...))
	}
	h, err := repository.New(cfg.LocalRepository.Directory, log, opts...)
	if err != nil {
		return nil, fmt.Errorf("localRepository.directory or extraDirectories: %w", err)
	}
	lis = lim.Listen(lis)
	srv := &http.Server{Handler: h}
	lim.HTTPServer(srv) // write, read-header and idle timeouts, per-source request rate
	if servingTLS != nil {
		srv.TLSConfig = servingTLS.Clone()
	}
	log.Info("local repository serving", "address", lis.Addr().String(), "directory", cfg.LocalRepository.Directory,
		"extraDirectories", cfg.LocalRepository.ExtraDirectories, "tls", servingTLS != nil)
	return &repositoryServer{lis: lis, srv: srv, handler: h, tls: servingTLS != nil}, nil
}

// loadSigner reads the repository's signing key and the public keys
// published beside it.
func loadSigner(keyFile string, publicKeyFiles []string) (*signing.Signer, error) {
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("localRepository.signingKeyFile: %w", err)
	}
	var published [][]byte
	for i, f := range publicKeyFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("localRepository.publicKeyFiles[%d]: %w", i, err)
		}
		published = append(published, b)
	}
	s, err := signing.New(key, published...)
	if err != nil {
		return nil, fmt.Errorf("localRepository.signingKeyFile %s: %w", keyFile, err)
	}
	return s, nil
}

func (r *repositoryServer) serve() error {
	if r.tls {
		return r.srv.ServeTLS(r.lis, "", "")
	}
	return r.srv.Serve(r.lis)
}

func (r *repositoryServer) shutdown(ctx context.Context) {
	_ = r.srv.Shutdown(ctx)
	_ = r.handler.Close()
}

// limiters are the limits of the endpoint's client-facing servers.
type limiters struct {
	onboarding, xds, repository *limits.Limiter
}

// newLimiters builds the limiters of limits.onboarding, limits.xds and
// limits.repository, counting refusals in reg.
func newLimiters(cfg *config.Configuration, reg prometheus.Registerer) (*limiters, error) {
	m, err := limits.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	var l limiters
	for _, x := range []struct {
		name string
		opts limits.Options
		out  **limits.Limiter
	}{{"onboarding", cfg.Limits.Onboarding, &l.onboarding}, {"xds", cfg.Limits.XDS, &l.xds}, {"repository", cfg.Limits.Repository, &l.repository}} {
		if *x.out, err = limits.New(x.name, x.opts, m); err != nil {
			return nil, fmt.Errorf("limits.%s: %w", x.name, err)
		}
	}
	return &l, nil
}
