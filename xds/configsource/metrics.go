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
	translations   prometheus.Counter
	configurations prometheus.Counter
	errors         *prometheus.CounterVec
	translate      prometheus.Histogram
	push           prometheus.Histogram
	pushed         prometheus.Counter
	ownReused      prometheus.Counter
}

// NewMetrics registers the embark_xds_config_* metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		translations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_config_translations_total",
			Help: "Scopes translated: one per distinct scope (namespace, Sidecar and policies selecting the workload) per change of the inputs; the proxies of a scope share it.",
		}),
		configurations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_config_configurations_total",
			Help: "Configurations computed for a proxy (its scope's shared translation plus its own ingress listeners and clusters).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_config_errors_total",
			Help: "Translations that failed; the proxy kept its previous configuration. reason: sidecar, validation or inputs.",
		}, []string{"reason"}),
		translate: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_xds_config_translation_seconds",
			Help:    "Time to compute one proxy's configuration: read its scope's inputs, translate the scope unless another proxy of it already did since the last change, add, validate and hash the proxy's own resources.",
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
		ownReused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_config_own_reused_total",
			Help: "Configurations computed whose proxy's own resources (ingress listeners, inbound clusters) were kept from its previous configuration, their inputs unchanged: not translated, validated or hashed again.",
		}),
	}
	for _, c := range []prometheus.Collector{m.translations, m.configurations, m.errors, m.translate, m.push, m.pushed, m.ownReused} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xDS configuration metrics: %w", err)
		}
	}
	return m, nil
}
