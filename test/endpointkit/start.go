// Package endpointkit runs the onboarding endpoint in process for tests:
// Start runs cmd/onboarding-endpoint/app.Run with a configuration built by
// test/endpointkit/configkit until the test ends.
package endpointkit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/freeport"
)

// Guards against a hung endpoint; none is a timing assertion.
const (
	readyTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
	// attempts bounds the starts with new ports when one that Start
	// picked is taken by another process between its pick and the listen.
	attempts = 3
)

// Options are how Start runs the endpoint.
type Options struct {
	// Config is the configuration. Required. Its empty listen addresses
	// (onboarding, metrics, xds, repository) get free loopback ports; Start
	// does not change Config itself.
	Config *config.Configuration
	// Kubeconfig of the API server. Required.
	Kubeconfig string
	// Replica names the endpoint. Default "endpoint-" + Config.Namespace.
	Replica string
	// Logger receives the endpoint's log. Default: discarded.
	Logger *slog.Logger
	// DebugXDS is app.Options.DebugXDS. Default "off".
	DebugXDS string
	// Dir is where the configuration file is written. Default a new
	// t.TempDir().
	Dir string
}

// Endpoint is a running endpoint.
type Endpoint struct {
	// Config is the configuration it runs, with its listen addresses.
	Config *config.Configuration
	// ConfigFile is Config's file.
	ConfigFile string
	stop       func()
}

// Stop shuts the endpoint down as a SIGTERM does (its streams closed, its
// states flushed) and waits for it; an error it returns is the test's
// error. The test's clean-up calls it too; calls after the first do nothing.
func (e *Endpoint) Stop() { e.stop() }

// Start runs the endpoint until the test ends (or Stop) and returns once it
// serves; it fails the test when the endpoint does not start. When a listen
// address Start picked turns out to be in use, it starts again with new
// ones, at most three times in all.
func Start(t testing.TB, opts Options) *Endpoint {
	t.Helper()
	return start(t, opts, freeport.Addr)
}

// start is Start with the source of free addresses.
func start(t testing.TB, opts Options, pick func() (string, error)) *Endpoint {
	t.Helper()
	setDefaults(t, &opts)
	for attempt := 1; ; attempt++ {
		cfg := *opts.Config
		picked := fillListen(t, &cfg.Listen, pick)
		e, err := run(t, opts, &cfg)
		if err == nil {
			return e
		}
		if !picked || attempt == attempts || !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("endpoint: %v", err)
		}
		t.Logf("endpoint: %v; starting again on other ports", err)
	}
}

func setDefaults(t testing.TB, opts *Options) {
	if opts.Replica == "" {
		opts.Replica = "endpoint-" + opts.Config.Namespace
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.DebugXDS == "" {
		opts.DebugXDS = "off"
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
}

// fillListen gives every empty address of l a free one from pick, and
// reports whether it gave any.
func fillListen(t testing.TB, l *config.Listen, pick func() (string, error)) bool {
	t.Helper()
	picked := false
	for _, addr := range []*string{&l.Onboarding, &l.Metrics, &l.XDS, &l.Repository} {
		if *addr != "" {
			continue
		}
		a, err := pick()
		if err != nil {
			t.Fatal(err)
		}
		*addr, picked = a, true
	}
	return picked
}

// run starts app.Run with cfg and waits until it serves; the error is
// app.Run's when it ends first.
func run(t testing.TB, opts Options, cfg *config.Configuration) (*Endpoint, error) {
	t.Helper()
	e := &Endpoint{Config: cfg, ConfigFile: configkit.WriteFile(t, opts.Dir, cfg)}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done, ready := make(chan error, 1), make(chan struct{})
	go func() {
		done <- app.Run(ctx, app.Options{ConfigFile: e.ConfigFile, Kubeconfig: opts.Kubeconfig, Replica: opts.Replica,
			DebugXDS: opts.DebugXDS, Logger: opts.Logger, Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return nil, err
	case <-time.After(readyTimeout):
		cancel()
		<-done
		t.Fatalf("endpoint not ready within %s", readyTimeout)
	}
	var once sync.Once
	e.stop = func() { once.Do(func() { stop(t, cancel, done) }) }
	t.Cleanup(e.stop)
	return e, nil
}

// stop cancels the endpoint and reports what it returns.
func stop(t testing.TB, cancel context.CancelFunc, done <-chan error) {
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("endpoint returned %v after shutdown", err)
		}
	case <-time.After(stopTimeout):
		t.Error("endpoint did not stop")
	}
}
