package hostdns

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRender(t *testing.T) {
	tests := []struct {
		name    string
		addr    string
		domains []string
		want    string
		wantErr string
	}{
		{name: "default", addr: "127.0.0.1:15053", domains: []string{"cluster.local"}, want: "[Resolve]\nDNS=127.0.0.1:15053\nDomains=~cluster.local\n"},
		{name: "several domains, case and trailing dot", addr: "127.0.0.1:15053", domains: []string{"cluster.local", "Example.COM."},
			want: "Domains=~cluster.local ~example.com\n"},
		{name: "ipv6 loopback", addr: "[::1]:15053", domains: []string{"cluster.local"}, want: "DNS=[::1]:15053\n"},
		{name: "not loopback", addr: "10.0.0.7:15053", domains: []string{"cluster.local"}, wantErr: "loopback"},
		{name: "no port", addr: "127.0.0.1", domains: []string{"cluster.local"}, wantErr: "loopback ip:port"},
		{name: "no domains", addr: "127.0.0.1:15053", wantErr: "no domains"},
		{name: "injected line", addr: "127.0.0.1:15053", domains: []string{"cluster.local\nDNSStubListener=no"}, wantErr: "domain"},
		{name: "root domain", addr: "127.0.0.1:15053", domains: []string{"."}, wantErr: "domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Render(tt.addr, tt.domains)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(got), tt.want) || !strings.HasPrefix(string(got), "#") {
				t.Errorf("drop-in:\n%s\nwant it to hold %q after its header", got, tt.want)
			}
		})
	}
}

func TestEnableDisable(t *testing.T) {
	dir := t.TempDir()
	reloads := 0
	o := Options{Dir: filepath.Join(dir, "resolved.conf.d"), Reload: func(context.Context) error { reloads++; return nil }}
	content, err := Render("127.0.0.1:15053", []string{"cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(o.Dir, DropInName)
	steps := []struct {
		name        string
		do          func() (bool, error)
		wantChanged bool
		wantFile    bool
		wantReloads int
	}{
		{"no resolved: nothing", func() (bool, error) { return Enable(t.Context(), o, content, false) }, false, false, 0},
		{"disable when absent", func() (bool, error) { return Disable(t.Context(), o) }, false, false, 0},
		{"enable", func() (bool, error) { return Enable(t.Context(), o, content, true) }, true, true, 1},
		{"enable again: unchanged, no reload", func() (bool, error) { return Enable(t.Context(), o, content, true) }, false, true, 1},
		{"disable", func() (bool, error) { return Disable(t.Context(), o) }, true, false, 2},
	}
	for _, s := range steps {
		changed, err := s.do()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		_, statErr := os.Stat(path)
		if changed != s.wantChanged || (statErr == nil) != s.wantFile || reloads != s.wantReloads {
			t.Errorf("%s: changed=%v file=%v reloads=%d, want %v %v %d", s.name, changed, statErr == nil, reloads, s.wantChanged, s.wantFile, s.wantReloads)
		}
	}
}
