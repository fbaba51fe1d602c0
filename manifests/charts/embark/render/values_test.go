package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// values merges files, then --set values as Helm parses them (lists by
// index, dotted paths, later wins), then the JSON object; a --set Helm
// refuses is an error naming it.
func TestValuesSetFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte("replicas: 3\ntls:\n  secretName: from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   []string
		sets    []string
		json    string
		want    map[string]any
		wantErr string
	}{
		{name: "README's flags", sets: []string{"hosts[0]=onboarding-endpoint.your-company.corp", "tls.secretName=onboarding-endpoint-tls"},
			want: map[string]any{"hosts": []any{"onboarding-endpoint.your-company.corp"}, "tls": map[string]any{"secretName": "onboarding-endpoint-tls"}}},
		{name: "set over a file", files: []string{file}, sets: []string{"tls.secretName=from-set"},
			want: map[string]any{"replicas": float64(3), "tls": map[string]any{"secretName": "from-set"}}},
		{name: "json over set", sets: []string{"replicas=2"}, json: `{"replicas":4}`,
			want: map[string]any{"replicas": float64(4)}},
		{name: "typed like helm", sets: []string{"istiod.relayXDS=false,replicas=1"},
			want: map[string]any{"istiod": map[string]any{"relayXDS": false}, "replicas": int64(1)}},
		{name: "bad set", sets: []string{"hosts[x]=a"}, wantErr: "-set hosts[x]=a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := values(tc.files, tc.sets, tc.json)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("values %#v, want %#v", got, tc.want)
			}
		})
	}
}
