package config

import "testing"

// FuzzParse: no input panics, and an accepted configuration is valid after
// defaulting (parsing is idempotent on what it accepts).
func FuzzParse(f *testing.F) {
	f.Add([]byte(goodAgent))
	f.Add([]byte(goodOnboarding))
	f.Add([]byte("apiVersion: " + APIVersion + "\nkind: AgentConfiguration\nsidecar: {restartCommand: []}\n"))
	f.Add([]byte("onboardingEndpoint: {host: '[::1]:1'}\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if cfg, err := ParseAgent(data); err == nil {
			if errs := cfg.Validate(); len(errs) > 0 {
				t.Fatalf("accepted an invalid agent configuration: %v", errs)
			}
		}
		if cfg, err := ParseOnboarding(data); err == nil {
			if errs := cfg.Validate(); len(errs) > 0 {
				t.Fatalf("accepted an invalid onboarding configuration: %v", errs)
			}
			if _, _, err := SplitHostPort(cfg.Address()); err != nil {
				t.Fatalf("Address() %q does not parse: %v", cfg.Address(), err)
			}
		}
	})
}
