package manifests

import (
	"reflect"
	"testing"
	"time"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The endpoint settings the chart exposes as values reach the endpoint:
// its configuration, parsed as the endpoint parses it at start, holds each
// value set.
func TestChartEndpointSettingsReachTheEndpoint(t *testing.T) {
	_, objs := renderChart(t, map[string]any{
		"registration":          map[string]any{"outOfTrafficAfter": "30s"},
		"detailedDenialSources": []any{"10.20.0.0/16"},
		"limits":                map[string]any{"xds": map[string]any{"maxSubscribedNamesPerType": 5000, "maxSubscribedNameBytesPerStream": 1 << 21}},
		"istiod":                map[string]any{"maxCertificateValidity": "12h", "certificateRelay": map[string]any{"requestsPerSecond": 200.5, "burst": 500, "maxInFlight": 256}},
		"localRepository":       map[string]any{"enabled": true, "metadataValidity": "48h"},
	})
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	if cfg.LocalRepository == nil {
		t.Fatal("localRepository.enabled rendered no localRepository")
	}
	dur := func(d *metav1.Duration) time.Duration {
		if d == nil {
			return 0
		}
		return d.Duration
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"registration.outOfTrafficAfter", dur(cfg.Registration.OutOfTrafficAfter), 30 * time.Second},
		{"endpoint.detailedDenialSources", cfg.Endpoint.DetailedDenialSources, []string{"10.20.0.0/16"}},
		{"limits.xds.maxSubscribedNamesPerType", cfg.Limits.XDS.MaxSubscribedNamesPerType, 5000},
		{"limits.xds.maxSubscribedNameBytesPerStream", cfg.Limits.XDS.MaxSubscribedNameBytesPerStream, 1 << 21},
		{"istiod.maxCertificateValidity", dur(cfg.Istiod.MaxCertificateValidity), 12 * time.Hour},
		{"istiod.certificateRelay", cfg.Istiod.CertificateRelay, &config.CertificateRelay{RequestsPerSecond: 200.5, Burst: 500, MaxInFlight: 256}},
		{"localRepository.metadataValidity", dur(cfg.LocalRepository.MetadataValidity), 48 * time.Hour},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}
