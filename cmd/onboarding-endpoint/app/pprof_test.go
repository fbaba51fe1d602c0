package app

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func TestPprofListener(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:6060", "[::]:0", "nohost"} {
		if _, _, err := startPprof(addr, log); err == nil || !strings.Contains(err.Error(), "pprof listener") {
			t.Errorf("startPprof(%q) = %v, want a refusal (loopback only)", addr, err)
		}
	}
	addr, stop, err := startPprof("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Errorf("heap profile: %s, %d bytes", resp.Status, len(body))
	}
	stop()
	if _, err := http.Get("http://" + addr + "/debug/pprof/"); err == nil {
		t.Error("pprof still served after stop")
	}
}
