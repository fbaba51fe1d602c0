package xds

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/xds/tokenauth"
)

// unusedInformers and unusedReviewer satisfy Options for tests that open no
// stream.
type (
	unusedInformers struct{ Informers }
	unusedReviewer  struct{ tokenauth.Reviewer }
)

// TestSnapshotCacheLogsThroughLogger: go-control-plane's snapshot cache
// logs to the server's injected logger, tagged with its component.
func TestSnapshotCacheLogsThroughLogger(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	conns, err := presence.NewConnections(t.Context(), presence.ConnectionOptions{Client: unusedClient{}, Replica: "r"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(t.Context(), Options{
		Connections: conns, TokenReviews: unusedReviewer{}, Reader: unusedClient{}, Informers: unusedInformers{},
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	empty, err := EmptyConfig{}.Snapshot(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.snapshots.SetSnapshot(t.Context(), "sidecar~10.0.0.1~vm.bookinfo~bookinfo.svc.cluster.local", empty); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"level=DEBUG", "component=snapshot-cache", "setting snapshot for node sidecar~10.0.0.1~vm.bookinfo~bookinfo.svc.cluster.local"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the server's log does not hold %q:\n%s", want, buf.String())
		}
	}
}

func TestCacheLoggerLevels(t *testing.T) {
	tests := []struct {
		name      string
		min       slog.Level
		log       func(l cacheLogger)
		wantLevel string // "" when nothing is written
	}{
		{name: "debug", min: slog.LevelDebug, log: func(l cacheLogger) { l.Debugf("watch %d", 1) }, wantLevel: "DEBUG"},
		{name: "debug below the level", min: slog.LevelInfo, log: func(l cacheLogger) { l.Debugf("watch %d", 1) }},
		{name: "info", min: slog.LevelInfo, log: func(l cacheLogger) { l.Infof("watch %d", 1) }, wantLevel: "INFO"},
		{name: "warn", min: slog.LevelInfo, log: func(l cacheLogger) { l.Warnf("watch %d", 1) }, wantLevel: "WARN"},
		{name: "error", min: slog.LevelError, log: func(l cacheLogger) { l.Errorf("watch %d", 1) }, wantLevel: "ERROR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.log(cacheLogger{t.Context(), slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.min}))})
			got := buf.String()
			switch {
			case tt.wantLevel == "" && got != "":
				t.Errorf("wrote %q, want nothing", got)
			case tt.wantLevel != "" && (!strings.Contains(got, "level="+tt.wantLevel) || !strings.Contains(got, `msg="watch 1"`)):
				t.Errorf("wrote %q, want level %s and message \"watch 1\"", got, tt.wantLevel)
			}
		})
	}
}
