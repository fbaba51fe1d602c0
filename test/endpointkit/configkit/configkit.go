// Package configkit is the tests' one way to write the onboarding
// endpoint's configuration file: Config builds it as the config package's
// own Go types (a field renamed there breaks the tests' compile, not their
// runtime), Marshal renders it as the YAML config.Parse reads, WriteFile
// writes it. It imports nothing of the endpoint but its config package, so
// that cmd/onboarding-endpoint/app's own tests use it too (test/endpointkit,
// which runs app.Run, cannot be imported there).
package configkit

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
)

// Host is the endpoint host Config names: the audience of its onboarding
// tokens.
const Host = "onboarding-endpoint.example.corp"

// Config returns the configuration of an endpoint for namespace ns serving
// Host in plaintext; everything else is the default. Start fills the listen
// addresses left empty with free loopback ports.
func Config(ns string) *config.Configuration {
	return &config.Configuration{
		TypeMeta:  metav1.TypeMeta{APIVersion: config.APIVersion, Kind: config.Kind},
		Namespace: ns,
		Endpoint:  config.Endpoint{Hosts: []string{Host}, Plaintext: true},
	}
}

// Serving replaces cfg's plaintext with the serving certificate and key
// files, and returns cfg.
func Serving(cfg *config.Configuration, certFile, keyFile string) *config.Configuration {
	cfg.Endpoint.Plaintext = false
	cfg.Endpoint.CertFile, cfg.Endpoint.KeyFile = certFile, keyFile
	return cfg
}

// Duration returns d as the configuration's duration type.
func Duration(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// Marshal renders cfg as the YAML configuration file config.Parse reads.
func Marshal(cfg *config.Configuration) ([]byte, error) {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("marshal endpoint configuration: %w", err)
	}
	return data, nil
}

// WriteFile writes cfg to dir/config.yaml and returns the file's path.
func WriteFile(t testing.TB, dir string, cfg *config.Configuration) string {
	t.Helper()
	data, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}
