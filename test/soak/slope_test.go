package soak

import (
	"math"
	"testing"
)

func TestFit(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4, 5, 6, 7}
	flat := []float64{100, 103, 98, 101, 99, 102, 100, 101}
	growing := []float64{100, 110, 120, 130, 141, 150, 160, 170}
	if tr := Fit(xs, flat); !tr.Flat(0.05) || math.Abs(tr.Slope) > 1 {
		t.Errorf("flat series: %+v", tr)
	}
	tr := Fit(xs, growing)
	if tr.Flat(0.05) || math.Abs(tr.Slope-10) > 0.2 || math.Abs(tr.Change-70) > 2 {
		t.Errorf("growing series: %+v", tr)
	}
	if tr := Fit([]float64{1}, []float64{1}); tr != (Trend{}) {
		t.Errorf("one sample: %+v", tr)
	}
}
