package app

import (
	"testing"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/xds"
)

// The xDS server's defaults, for callers that pass none, are the endpoint
// configuration's defaults (xds does not import the configuration).
func TestXDSDefaultsAreTheConfigurationDefaults(t *testing.T) {
	if xds.DefaultFirstRequestTimeout != limits.DefaultFirstRequestTimeout {
		t.Errorf("xds.DefaultFirstRequestTimeout = %v, limits.DefaultFirstRequestTimeout = %v", xds.DefaultFirstRequestTimeout, limits.DefaultFirstRequestTimeout)
	}
}
