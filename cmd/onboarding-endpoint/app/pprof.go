package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/embark-mesh/embark/xds"
)

// startPprof serves Go's runtime profiles (/debug/pprof/) on addr, which
// must be a loopback address: profiles show internals and are
// unauthenticated. It is opt-in (-pprof), for soak runs and debugging
// with `kubectl port-forward`. It returns the address it listens on and a
// function that stops the server.
func startPprof(addr string, log *slog.Logger) (string, func(), error) {
	if err := xds.CheckLoopback(addr); err != nil {
		return "", nil, fmt.Errorf("pprof listener: %w", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listen on %s (pprof): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && err != http.ErrServerClosed {
			log.Error("pprof listener stopped", "error", err)
		}
	}()
	log.Info("serving Go profiles (loopback only)", "pprof", lis.Addr().String())
	return lis.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
