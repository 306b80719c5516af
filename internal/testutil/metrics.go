package testutil

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// ToFloat64 is the sum of the samples of the named metric, across all its
// label values, gathered from g. For a histogram, name its _count or _sum.
// A metric that was never set is 0.
func ToFloat64(g prometheus.Gatherer, name string) float64 {
	families, err := g.Gather()
	if err != nil {
		return -1
	}
	base, part := name, ""
	for _, suffix := range []string{"_count", "_sum"} {
		if before, ok := strings.CutSuffix(name, suffix); ok {
			base, part = before, suffix
		}
	}
	var sum float64
	for _, f := range families {
		switch f.GetName() {
		case name:
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		case base:
			for _, m := range f.GetMetric() {
				if h := m.GetHistogram(); h != nil && part == "_count" {
					sum += float64(h.GetSampleCount())
				} else if h != nil && part == "_sum" {
					sum += h.GetSampleSum()
				}
			}
		}
	}
	return sum
}
