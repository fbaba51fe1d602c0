//go:build tools

// Package tools pins nfpm, which `make packages` builds the onboarding-agent
// DEB and RPM packages with.
package tools

import _ "github.com/goreleaser/nfpm/v2/cmd/nfpm"
