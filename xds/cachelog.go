package xds

import (
	"context"
	"fmt"
	"log/slog"

	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
)

// cacheLogger writes go-control-plane's logs (of the snapshot cache: watches
// opened and answered, snapshots set) to an injected slog logger, at the
// level go-control-plane names. They are mostly Debug. go-control-plane
// passes no context: ctx is the server's.
type cacheLogger struct {
	ctx context.Context
	log *slog.Logger
}

var _ gcplog.Logger = cacheLogger{}

func (l cacheLogger) logf(level slog.Level, format string, args []any) {
	if l.log.Enabled(l.ctx, level) {
		l.log.Log(l.ctx, level, fmt.Sprintf(format, args...))
	}
}

// Debugf implements log.Logger.
func (l cacheLogger) Debugf(format string, args ...any) { l.logf(slog.LevelDebug, format, args) }

// Infof implements log.Logger.
func (l cacheLogger) Infof(format string, args ...any) { l.logf(slog.LevelInfo, format, args) }

// Warnf implements log.Logger.
func (l cacheLogger) Warnf(format string, args ...any) { l.logf(slog.LevelWarn, format, args) }

// Errorf implements log.Logger.
func (l cacheLogger) Errorf(format string, args ...any) { l.logf(slog.LevelError, format, args) }
