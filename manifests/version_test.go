package manifests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// versionFiles are the files that name the release version: what
// test/tools/set-version.sh (make set-version) edits.
var versionFiles = []string{
	"VERSION",
	"manifests/charts/embark/Chart.yaml",
	"manifests/base/kustomization.yaml",
	"manifests/istio-operator/istio-operator.yaml",
	"docs/install.md",
}

// historyFiles name versions as history (what changed in which release),
// not as the version of this tree.
var historyFiles = []string{"CHANGELOG.md", "docs/upgrade.md", "docs/compatibility.md"}

// versionPlaces reads each place under root that names the release
// version and returns what it says (with the leading v; the chart's
// version, SemVer without it, gets one added).
func versionPlaces(t *testing.T, root string) map[string][]string {
	t.Helper()
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	all := func(re, name string) []string {
		var out []string
		for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(read(name), -1) {
			out = append(out, m[1])
		}
		if len(out) == 0 {
			t.Errorf("%s: nothing matches %s", name, re)
		}
		return out
	}
	chart := read("manifests/charts/embark/Chart.yaml")
	var chartVersion []string
	for _, m := range regexp.MustCompile(`(?m)^version: (\S+)$`).FindAllStringSubmatch(chart, -1) {
		chartVersion = append(chartVersion, "v"+m[1])
	}
	return map[string][]string{
		"VERSION":                     {strings.TrimSpace(read("VERSION"))},
		"Chart.yaml version":          chartVersion,
		"Chart.yaml appVersion":       all(`(?m)^appVersion: (\S+)$`, "manifests/charts/embark/Chart.yaml"),
		"kustomize base newTag":       all(`(?m)^  newTag: (\S+)$`, "manifests/base/kustomization.yaml"),
		"IstioOperator overlay image": all(`image: embark-mesh/onboarding-endpoint:(\S+)`, "manifests/istio-operator/istio-operator.yaml"),
		"docs/install.md image tags":  all(`(?:onboarding-endpoint|layout|oci\.tar):(v[0-9]\S*)`, "docs/install.md"),
	}
}

// disagreements lists the places that do not say want.
func disagreements(places map[string][]string, want string) []string {
	var out []string
	for place, got := range places {
		if len(got) == 0 {
			out = append(out, place+": no version")
		}
		for _, v := range got {
			if v != want {
				out = append(out, place+": "+v)
			}
		}
	}
	slices.Sort(out)
	return out
}

// The version is set in one place: every file naming it agrees with
// VERSION (the Makefile reads it for build info, packages and the image;
// TestChartMatchesKustomizeBase checks the rendered chart and base deploy
// that tag), no other tracked file names it, and make set-version's script
// changes every place, refusing a malformed version.
func TestVersionSetInOnePlace(t *testing.T) {
	want := versionPlaces(t, "..")["VERSION"][0]
	if d := disagreements(versionPlaces(t, ".."), want); len(d) > 0 {
		t.Errorf("places disagree with VERSION %s (run make set-version V=%s): %v", want, want, d)
	}

	t.Run("no other file names the version", func(t *testing.T) {
		out, err := exec.CommandContext(t.Context(), "git", "-C", "..", "ls-files").Output()
		if err != nil {
			t.Fatalf("git ls-files: %v", err)
		}
		for _, name := range strings.Fields(string(out)) {
			if slices.Contains(versionFiles, name) || slices.Contains(historyFiles, name) {
				continue
			}
			data, err := os.ReadFile(filepath.Join("..", name))
			if err != nil {
				continue // deleted in the work tree
			}
			if bytes.Contains(data, []byte(want)) {
				t.Errorf("%s names the version %s: add it to test/tools/set-version.sh and versionFiles", name, want)
			}
		}
	})

	t.Run("set-version changes every place", func(t *testing.T) {
		root := t.TempDir()
		for _, name := range versionFiles {
			data, err := os.ReadFile(filepath.Join("..", name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		run := func(v string) (string, error) {
			out, err := exec.CommandContext(t.Context(), "../test/tools/set-version.sh", root, v).CombinedOutput()
			return string(out), err
		}
		for _, v := range []string{"9.8.7-rc.1", "v10.0.0"} {
			if out, err := run(v); err != nil {
				t.Fatalf("set-version %s: %v: %s", v, err, out)
			}
			want := "v" + strings.TrimPrefix(v, "v")
			if d := disagreements(versionPlaces(t, root), want); len(d) > 0 {
				t.Errorf("after set-version %s: %v", v, d)
			}
		}
		before := versionPlaces(t, root)
		for _, bad := range []string{"", "1.2", "v1.2.3.4", "01.2.3", "1.2.3 ", "1.2.3/evil"} {
			out, err := run(bad)
			if err == nil {
				t.Errorf("set-version %q succeeded: %s", bad, out)
			} else if !strings.Contains(out, "is not a version") {
				t.Errorf("set-version %q: %q, want a message saying it is not a version", bad, out)
			}
		}
		if d := disagreements(before, "v10.0.0"); len(d) > 0 || len(disagreements(versionPlaces(t, root), "v10.0.0")) > 0 {
			t.Errorf("a refused version changed a place: %v", disagreements(versionPlaces(t, root), "v10.0.0"))
		}
	})
}
