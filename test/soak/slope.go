package soak

import "math"

// Trend is a least-squares line through samples.
type Trend struct {
	// Slope per unit of x, and the projected change over the whole window.
	Slope, Change float64
	// Mean of the samples and the standard deviation of their residuals
	// around the line (the noise).
	Mean, Noise float64
}

// Fit fits a line to (xs, ys).
func Fit(xs, ys []float64) Trend {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return Trend{}
	}
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	t := Trend{Mean: my}
	if sxx == 0 {
		return t
	}
	t.Slope = sxy / sxx
	var ss float64
	for i := range xs {
		r := ys[i] - (my + t.Slope*(xs[i]-mx))
		ss += r * r
	}
	t.Noise = math.Sqrt(ss / n)
	t.Change = t.Slope * (xs[len(xs)-1] - xs[0])
	return t
}

// Flat reports whether the projected change over the window is within
// noise: at most three residual standard deviations, or at most tolerance
// (a fraction) of the mean, whichever is larger.
func (t Trend) Flat(tolerance float64) bool {
	return math.Abs(t.Change) <= math.Max(3*t.Noise, tolerance*math.Abs(t.Mean))
}
