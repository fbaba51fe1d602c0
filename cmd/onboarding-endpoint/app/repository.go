package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/embark-mesh/embark/onboarding/config"
	"github.com/embark-mesh/embark/onboarding/repository"
)

// repositoryServer is the local repository's HTTPS listener.
type repositoryServer struct {
	lis     net.Listener
	srv     *http.Server
	handler *repository.Handler
	tls     bool
}

// startRepository opens the local repository's listener when
// localRepository is configured (nil otherwise). It serves with the
// endpoint's serving certificate (plaintext only with endpoint.plaintext).
func startRepository(cfg *config.Configuration, servingTLS *tls.Config, log *slog.Logger) (*repositoryServer, error) {
	if cfg.LocalRepository == nil {
		return nil, nil
	}
	h, err := repository.New(cfg.LocalRepository.Directory, log)
	if err != nil {
		return nil, fmt.Errorf("localRepository.directory: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.Listen.Repository)
	if err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("listen on %s (listen.repository): %w", cfg.Listen.Repository, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	if servingTLS != nil {
		srv.TLSConfig = servingTLS.Clone()
	}
	log.Info("local repository serving", "address", lis.Addr().String(), "directory", cfg.LocalRepository.Directory, "tls", servingTLS != nil)
	return &repositoryServer{lis: lis, srv: srv, handler: h, tls: servingTLS != nil}, nil
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
