package configsource

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Error reasons of embark_xds_config_errors_total.
const (
	reasonSidecar    = "sidecar"    // the selected Sidecar cannot be translated
	reasonValidation = "validation" // a translated resource is invalid
	reasonInputs     = "inputs"     // the inputs could not be read
)

// Metrics of the configuration served.
type Metrics struct {
	translations prometheus.Counter
	errors       *prometheus.CounterVec
	translate    prometheus.Histogram
	push         prometheus.Histogram
	pushed       prometheus.Counter
}

// NewMetrics registers the embark_xds_config_* metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		translations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_config_translations_total",
			Help: "Configurations translated for a proxy.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_config_errors_total",
			Help: "Translations that failed; the proxy kept its previous configuration. reason: sidecar, validation or inputs.",
		}, []string{"reason"}),
		translate: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_xds_config_translation_seconds",
			Help:    "Time to read the inputs of one proxy, translate and validate them.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		push: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_xds_config_push_seconds",
			Help:    "Time from the first change of a debounced batch to every affected proxy's new configuration being set (debounce included).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		pushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_config_recomputed_proxies_total",
			Help: "Proxies whose configuration was recomputed after a change of the inputs.",
		}),
	}
	for _, c := range []prometheus.Collector{m.translations, m.errors, m.translate, m.push, m.pushed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xDS configuration metrics: %w", err)
		}
	}
	return m, nil
}
