package servingcert

import (
	"crypto/x509"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// expiryDesc describes embark_serving_certificate_expiry_timestamp_seconds.
var expiryDesc = prometheus.NewDesc("embark_serving_certificate_expiry_timestamp_seconds",
	"When the onboarding endpoint's current TLS serving certificate expires, in Unix seconds.", nil, nil)

// expiryCollector reports the expiry of the certificate current returns,
// read at each scrape so that a rotated certificate shows at once; nothing
// while there is none.
type expiryCollector struct {
	current func() *x509.Certificate
}

func (c expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (c expiryCollector) Collect(ch chan<- prometheus.Metric) {
	if leaf := c.current(); leaf != nil {
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(leaf.NotAfter.Unix()))
	}
}

// RegisterExpiry registers with reg
// embark_serving_certificate_expiry_timestamp_seconds, the NotAfter of the
// certificate current returns (Source.Current) at each scrape.
func RegisterExpiry(reg prometheus.Registerer, current func() *x509.Certificate) error {
	if err := reg.Register(expiryCollector{current: current}); err != nil {
		return fmt.Errorf("register serving certificate metrics: %w", err)
	}
	return nil
}
