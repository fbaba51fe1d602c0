package adversarial

import (
	"strings"
	"testing"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
)

func TestPlaintextOffLoopback(t *testing.T) {
	Attack(t, "config: endpoint.plaintext (no TLS) on a routable listen address")
	for _, listen := range []string{
		"listen: {onboarding: ':15443', xds: '127.0.0.1:15012'}",
		"listen: {onboarding: '127.0.0.1:15443', xds: '0.0.0.0:15012'}",
		"listen: {onboarding: '127.0.0.1:15443', xds: '127.0.0.1:15012', repository: '10.0.0.1:8443'}\nlocalRepository: {}",
	} {
		_, err := config.Parse([]byte("apiVersion: config.onboarding.tetrate.io/v1alpha1\nkind: OnboardingEndpointConfiguration\nendpoint:\n  hosts: [e.example]\n  plaintext: true\n" + listen + "\n"))
		if err == nil || !strings.Contains(err.Error(), "endpoint.plaintext serves without TLS") {
			t.Errorf("%s: %v, want a configuration error naming endpoint.plaintext", listen, err)
		}
	}
}
