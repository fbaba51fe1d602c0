package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// imagesEnv names the directory `make dashboard-images` renders the
// panels to; without it the test renders them to a temporary directory.
const imagesEnv = "EMBARK_DASHBOARD_IMAGES"

// rowModes are the modes a dashboard row is for, by the prefix of its
// title.
var rowModes = map[string][]string{
	"Both modes":      {"istiod", "standalone"},
	"istiod mode":     {"istiod"},
	"Standalone mode": {"standalone"},
}

// panel is a dashboard panel with the row it is under.
type panel struct {
	title, row, unit string
	modes            []string
	targets          []target
}

type target struct{ expr, legend string }

// panels reads the dashboard's panels with the modes of their rows; a
// panel above the first row, or under a row without a mode, fails.
func panels(t *testing.T) []panel {
	t.Helper()
	data, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	var out []panel
	row := ""
	var modes []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			row, modes = p.Title, nil
			for prefix, m := range rowModes {
				if strings.HasPrefix(p.Title, prefix+":") {
					modes = m
				}
			}
			if modes == nil {
				t.Errorf("row %q names no mode (its title starts with one of Both modes:, istiod mode:, Standalone mode:)", p.Title)
			}
			continue
		}
		if row == "" {
			t.Errorf("panel %q is above the first row: no mode says where it has data", p.Title)
		}
		pn := panel{title: p.Title, row: row, unit: p.FieldConfig.Defaults.Unit, modes: modes}
		for _, tg := range p.Targets {
			pn.targets = append(pn.targets, target{expr: tg.Expr, legend: tg.LegendFormat})
		}
		out = append(out, pn)
	}
	return out
}

// line is one series of a panel over a run: its legend and its finite
// points (x in minutes from the run's start).
type line struct {
	legend string
	xys    plotter.XYs
}

// panelLines evaluates every query of p over the run r as Grafana does (its
// variables replaced) and returns the series with at least one finite
// point: what the panel draws.
func panelLines(t *testing.T, r *run, p panel) []line {
	t.Helper()
	var out []line
	for _, tg := range p.targets {
		for _, s := range r.rangeQuery(t, grafanaExpr(tg.expr)) {
			l := line{legend: legend(tg.legend, s)}
			for _, pt := range s.Floats {
				if !math.IsNaN(pt.F) && !math.IsInf(pt.F, 0) {
					l.xys = append(l.xys, plotter.XY{X: float64(pt.T-r.start.UnixMilli()) / 60000, Y: pt.F})
				}
			}
			if len(l.xys) > 0 {
				out = append(out, l)
			}
		}
	}
	return out
}

var legendLabel = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// legend fills a target's legendFormat with the series' labels, as
// Grafana does; without one it is the series' labels.
func legend(format string, s promql.Series) string {
	if format == "" {
		return s.Metric.String()
	}
	return strings.TrimSpace(legendLabel.ReplaceAllStringFunc(format, func(m string) string {
		return s.Metric.Get(legendLabel.FindStringSubmatch(m)[1])
	}))
}

// imageName is the file a panel is rendered to.
func imageName(title string) string {
	return strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(title), "-"), "-") + ".svg"
}

// render draws a panel's lines over a run of minutes to an SVG file at
// path; a panel without a line is an error, never an empty picture.
func render(p panel, mode string, minutes float64, lines []line, path string) error {
	if len(lines) == 0 {
		return fmt.Errorf("panel %q has no data in %s mode", p.title, mode)
	}
	pl := plot.New()
	pl.Title.Text = p.title + " (" + mode + " mode)"
	unit, scale := yUnit(p.unit, lines)
	pl.Y.Label.Text = unit
	pl.X.Label.Text = "minutes into the run"
	pl.X.Min, pl.X.Max = 0, minutes
	pl.Legend.Top = true
	pl.Legend.Left = true
	pl.Add(plotter.NewGrid())
	if lowest(lines) >= 0 { // counts, rates, latencies and times from zero
		pl.Y.Min = 0
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].legend < lines[j].legend })
	for i, l := range lines {
		if i == 8 { // a legend of more lines hides the plot
			break
		}
		xys := make(plotter.XYs, len(l.xys))
		for k, xy := range l.xys {
			xys[k] = plotter.XY{X: xy.X, Y: xy.Y / scale}
		}
		lp, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("panel %q: %w", p.title, err)
		}
		lp.Color = plotutil.Color(i)
		lp.Width = vg.Points(1.5)
		pl.Add(lp)
		pl.Legend.Add(l.legend, lp)
	}
	if err := pl.Save(7*vg.Inch, 2.6*vg.Inch, path); err != nil {
		return fmt.Errorf("render panel %q: %w", p.title, err)
	}
	return nil
}

// zeros reports whether every point of lines is 0.
func zeros(lines []line) bool {
	for _, l := range lines {
		for _, xy := range l.xys {
			if xy.Y != 0 {
				return false
			}
		}
	}
	return true
}

// lowest is the smallest value of lines.
func lowest(lines []line) float64 {
	low := math.Inf(1)
	for _, l := range lines {
		for _, xy := range l.xys {
			low = math.Min(low, xy.Y)
		}
	}
	return low
}

// yUnit is the y axis' unit and the divisor of the values, as Grafana
// shows a panel's unit: seconds of two days or more in days, bytes in MiB.
func yUnit(unit string, lines []line) (string, float64) {
	largest := 0.0
	for _, l := range lines {
		for _, xy := range l.xys {
			largest = math.Max(largest, math.Abs(xy.Y))
		}
	}
	switch {
	case unit == "s" && largest >= 2*24*3600:
		return "days", 24 * 3600
	case unit == "bytes":
		return "MiB", 1 << 20
	case unit == "short":
		return "", 1
	}
	return unit, 1
}

// TestEveryPanelHasDataAndRenders runs Embark twice, standalone (two
// replicas) and in istiod mode (a replica relaying to a real istiod), each
// with a VM going twice through its life (onboarded, a denial, a refused
// stream, healthy, a NACK, its group changed, its stream closed and its
// registration removed after the grace period; in istiod mode certificates
// relayed, refused and failed at istiod), scraped into a TSDB. Every
// panel's queries, over each run its row is for, draw at least one line,
// and each panel renders to SVG from the run of its row's first mode (to
// the directory EMBARK_DASHBOARD_IMAGES names, for docs/images/dashboard).
func TestEveryPanelHasDataAndRenders(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ps := panels(t)
	runs := map[string]*run{"standalone": standaloneRun(t, ctx), "istiod": istiodRun(t, ctx)}

	dir := os.Getenv(imagesEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	for _, p := range ps {
		for i, mode := range p.modes {
			lines := panelLines(t, runs[mode], p)
			if len(lines) == 0 {
				t.Errorf("panel %q (row %q) shows no data in %s mode", p.title, p.row, mode)
				continue
			}
			if zeros(lines) {
				t.Logf("panel %q draws only zeros in %s mode", p.title, mode)
			}
			if i == 0 {
				if err := render(p, mode, runs[mode].end.Sub(runs[mode].start).Minutes(), lines, filepath.Join(dir, imageName(p.title))); err != nil {
					t.Error(err)
				}
			}
		}
	}
}

// The renderer refuses a panel without data: an empty picture is never
// written.
func TestRenderRefusesAnEmptyPanel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.svg")
	if err := render(panel{title: "Empty"}, "istiod", 10, nil, path); err == nil {
		t.Error("an empty panel rendered")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("an empty panel left a file: %v", err)
	}
}

// Every panel of the dashboard sits under a row whose title names the
// modes it has data in (checked without the runs, so a misplaced panel
// fails fast).
func TestEveryPanelIsUnderAModeRow(t *testing.T) {
	if ps := panels(t); len(ps) == 0 {
		t.Fatal("the dashboard has no panels")
	}
}
