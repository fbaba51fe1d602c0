// Command render renders Embark's Helm chart with Helm's own Go SDK, as
// `helm template` does, after the chart's values.schema.json check and
// Helm's lint rules. It lives in its own module so Embark's main module
// does not depend on Helm; manifests/chart_test.go runs it (go run) and
// checks the result against the real API server.
//
//	go run . [-namespace istio-system] [-release embark] [-f values.yaml]... [-set hosts[0]=a.example.corp]... [-set-json '{"replicas":3}'] ../
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
	sigsyaml "sigs.k8s.io/yaml"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "render: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	namespace := fs.String("namespace", "istio-system", "release namespace")
	release := fs.String("release", "embark", "release name")
	setJSON := fs.String("set-json", "", "values as a JSON object, merged last")
	var valueFiles, sets files
	fs.Var(&valueFiles, "f", "values file (repeatable)")
	fs.Var(&sets, "set", "a value as helm's --set takes it, e.g. hosts[0]=a.example.corp (repeatable; after the files)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one chart directory, got %d arguments", fs.NArg())
	}
	vals, err := values(valueFiles, sets, *setJSON)
	if err != nil {
		return err
	}
	out, err := Render(fs.Arg(0), *release, *namespace, vals)
	if err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(out)
	return err
}

// values merges the files, then the --set values (parsed by Helm's own
// parser, as `helm install --set` does), then the JSON object, over each
// other.
func values(valueFiles, sets []string, setJSON string) (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range valueFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("values file: %w", err)
		}
		var v map[string]any
		if err := sigsyaml.Unmarshal(data, &v); err != nil {
			return nil, fmt.Errorf("values file %s: %w", f, err)
		}
		vals = chartutil.MergeTables(v, vals)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("-set %s: %w", s, err)
		}
	}
	if setJSON != "" {
		var v map[string]any
		if err := json.Unmarshal([]byte(setJSON), &v); err != nil {
			return nil, fmt.Errorf("-set-json: %w", err)
		}
		vals = chartutil.MergeTables(v, vals)
	}
	return vals, nil
}

// Render lints the chart in dir with vals (Helm's lint rules, errors only),
// validates vals against values.schema.json and renders the templates in
// a stable order, one YAML document each (NOTES.txt left out).
func Render(dir, release, namespace string, vals map[string]any) (string, error) {
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return "", fmt.Errorf("load chart: %w", err)
	}
	if l := lint.RunAll(dir, vals, namespace); l.HighestSeverity >= support.ErrorSev {
		var msgs []string
		for _, m := range l.Messages {
			if m.Severity >= support.ErrorSev {
				msgs = append(msgs, m.Error())
			}
		}
		return "", fmt.Errorf("lint: %s", strings.Join(msgs, "; "))
	}
	return renderChart(ch, release, namespace, vals)
}

func renderChart(ch *chart.Chart, release, namespace string, vals map[string]any) (string, error) {
	rv, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{
		Name: release, Namespace: namespace, IsInstall: true, Revision: 1,
	}, common.DefaultCapabilities)
	if err != nil {
		return "", fmt.Errorf("values: %w", err)
	}
	rendered, err := engine.Render(ch, rv)
	if err != nil {
		return "", fmt.Errorf("render: %w", err)
	}
	names := make([]string, 0, len(rendered))
	for n := range rendered {
		if strings.HasSuffix(n, ".yaml") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		body := strings.TrimSpace(rendered[n])
		if body == "" {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, body)
	}
	return b.String(), nil
}
