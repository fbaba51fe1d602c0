package vmsim

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProxyConfig(t *testing.T) {
	pc, err := ProxyConfig([]byte(`defaultConfig:
  discoveryAddress: 127.0.0.1:15012
  readinessProbe:
    httpGet:
      path: /ready
      port: 9080
    periodSeconds: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	if pc.GetDiscoveryAddress() != "127.0.0.1:15012" || pc.GetReadinessProbe().GetHttpGet().GetPort() != 9080 || pc.GetReadinessProbe().GetPeriodSeconds() != 1 {
		t.Errorf("ProxyConfig %v", pc)
	}
	if pc, err := ProxyConfig([]byte("{}\n")); err != nil || pc.GetDiscoveryAddress() != "" {
		t.Errorf("empty mesh config: %v, %v", pc, err)
	}
	for _, bad := range []string{"defaultConfig: [1]\n", "defaultConfig:\n  noSuchField: 1\n", "a: b: c\n"} {
		if _, err := ProxyConfig([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The onboarding agent's restart and stop commands reach the unit and
// report its failures, a helper's fatal failure included.
func TestUnit(t *testing.T) {
	dir, err := os.MkdirTemp("", "unit-") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "sidecar.sock")
	var restarts, stops int
	failRestart := false
	u, err := StartUnit(sock, func() error {
		restarts++
		if failRestart {
			return errors.New("pilot-agent exited\nat once")
		}
		return nil
	}, func() error {
		stops++
		FatalTB{t}.Fatalf("fatal in a helper")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()

	for _, tt := range []struct {
		name, socket, verb string
		wantErr            string
		wantRestarts       int
		wantStops          int
	}{
		{name: "restart", socket: sock, verb: "restart", wantRestarts: 1},
		{name: "failed restart", socket: sock, verb: "restart", wantErr: "error: pilot-agent exited at once", wantRestarts: 2},
		{name: "stop failing fatally", socket: sock, verb: "stop", wantErr: "error: fatal in a helper", wantRestarts: 2, wantStops: 1},
		{name: "unknown verb", socket: sock, verb: "reload", wantErr: `unknown command "reload"`, wantRestarts: 2, wantStops: 1},
		{name: "no unit", socket: filepath.Join(dir, "none.sock"), verb: "restart", wantErr: "no such file", wantRestarts: 2, wantStops: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := Systemctl(tt.socket, tt.verb)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Systemctl = %v, want error %q", err, tt.wantErr)
			}
			if restarts != tt.wantRestarts || stops != tt.wantStops {
				t.Errorf("%d restarts, %d stops, want %d, %d", restarts, stops, tt.wantRestarts, tt.wantStops)
			}
			failRestart = true
		})
	}
}

func TestApp(t *testing.T) {
	a, err := StartApp("127.0.0.1", 0, "ratings on vm-1")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + a.Addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/ready"); code != http.StatusOK {
		t.Errorf("healthy /ready: %d", code)
	}
	a.SetHealthy(false)
	if code, _ := get("/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("unhealthy /ready: %d", code)
	}
	if code, body := get("/"); code != http.StatusOK || body != "ratings on vm-1\n" {
		t.Errorf("/: %d %q", code, body)
	}
}
