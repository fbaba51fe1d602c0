package app

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
)

// identity.gce.instanceCheck.credentialsFile must be a readable service
// account key; a valid one gets the checker the Compute API's answers.
func TestGCEInstanceCheckerCredentialsFile(t *testing.T) {
	api := gcetest.NewComputeAPI()
	t.Cleanup(api.Close)
	dir := t.TempDir()
	key, err := api.ServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, file, wantErr string
	}{
		{name: "missing", file: filepath.Join(dir, "absent.json"), wantErr: "credentialsFile"},
		{name: "not a service account key", file: write("user.json", `{"type":"authorized_user","client_id":"x","client_secret":"y","refresh_token":"z"}`), wantErr: "service account key"},
		{name: "a service account key", file: write("key.json", string(key))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := newGCEInstanceChecker(t.Context(), &config.GCEInstanceCheck{CredentialsFile: tt.file, ComputeEndpoint: api.URL()}, slog.New(slog.DiscardHandler))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("newGCEInstanceChecker() error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			in := gcetest.DefaultInstance()
			api.PutInstance(in)
			got, err := c.Describe(t.Context(), in.ProjectID, in.Zone, in.InstanceName)
			if err != nil || got.NetworkIP != in.IP {
				t.Fatalf("Describe() = %+v, %v; want nic0 %s", got, err, in.IP)
			}
		})
	}
}
