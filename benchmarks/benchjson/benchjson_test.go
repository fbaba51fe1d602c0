package benchjson

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteAndRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	var r Recorder
	r.Add(Result{Name: "Disconnect/streams=1000", Unit: "s", Value: 1.5, Baseline: "Bare/streams=1000"})
	if err := r.WriteFile(path, "example/pkg"); err != nil {
		t.Fatal(err)
	}
	f, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Package != "example/pkg" || len(f.Results) != 1 || f.Results[0].Value != 1.5 || f.Results[0].Baseline != "Bare/streams=1000" {
		t.Errorf("read back %+v", f)
	}
	if err := r.WriteFile("", "x"); err != nil {
		t.Errorf("no -json flag: %v", err)
	}
}

func TestParseRejects(t *testing.T) {
	for in, want := range map[string]string{
		`{"results":[{"name":"x","value":1}]}`:   "results[0] (x): unit is empty",
		`{"results":[{"unit":"s","value":1}]}`:   "results[0]: name is empty",
		`{"results":[{"name":"x","unit":"s",}]}`: "parse benchmark results",
	} {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v, want %q", in, err, want)
		}
	}
}
