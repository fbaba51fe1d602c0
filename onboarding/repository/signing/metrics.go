package signing

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// expiryDesc describes embark_repository_signing_key_expiry_timestamp_seconds.
var expiryDesc = prometheus.NewDesc("embark_repository_signing_key_expiry_timestamp_seconds",
	"When the local repository's OpenPGP signing key expires, in Unix seconds; absent for a key that does not expire.", nil, nil)

// expiryCollector reports the expiry of the signer current returns.
type expiryCollector struct {
	current func() *Signer
}

func (c expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (c expiryCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.current()
	if s == nil {
		return
	}
	if at, ok := s.Expiry(); ok {
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(at.Unix()))
	}
}

// RegisterExpiry registers with reg
// embark_repository_signing_key_expiry_timestamp_seconds, the Expiry of
// the signer current returns at each scrape (nothing for a key that does
// not expire, or no signer).
func RegisterExpiry(reg prometheus.Registerer, current func() *Signer) error {
	if err := reg.Register(expiryCollector{current: current}); err != nil {
		return fmt.Errorf("register repository signing key metrics: %w", err)
	}
	return nil
}
