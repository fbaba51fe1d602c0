//go:build tools

// Package tools records the commands built from this module; see go.mod.
package tools

import (
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-agent"
)
