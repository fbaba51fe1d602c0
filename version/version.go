// Package version says which build of Embark is running: the release
// version and source revision stamped at link time (one place: the
// Makefile's VERSION_LDFLAGS), with the Go toolchain and, when not stamped,
// the VCS revision Go records in the binary's build info.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at link time by the Makefile (make build, packages, image):
//
//	-X github.com/embark-mesh/embark/version.version=v0.1.0
//	-X github.com/embark-mesh/embark/version.revision=<git commit>
var (
	version  = ""
	revision = ""
)

// Info is one build's identity.
type Info struct {
	// Version is the release version ("v0.1.0"), or "dev" when not stamped.
	Version string
	// Revision is the source commit, from the stamp or Go's vcs.revision
	// build setting ("unknown" when neither is present); "-dirty" is
	// appended when Go recorded modified sources.
	Revision string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Get returns the running binary's Info.
func Get() Info {
	info := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Revision == "" {
		info.Revision = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			var rev, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if rev != "" {
				info.Revision = rev
				if modified == "true" {
					info.Revision += "-dirty"
				}
			}
		}
	}
	return info
}

// String is the line `--version` prints: "<binary> <version> (revision
// <revision>, <go version>)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}

// Line is what a binary named name prints for --version.
func Line(name string) string { return name + " " + Get().String() }

// Register adds embark_build_info{version,revision,goversion} (always 1) to reg.
func Register(reg prometheus.Registerer) error {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "embark_build_info",
		Help:        "Always 1; the labels say which build of Embark is running.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register build info: %w", err)
	}
	return nil
}
