package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// seedPaths are every repository path of the VM install guide's commands,
// plus a revisioned sidecar.
var seedPaths = []string{
	"/install/deb/amd64/onboarding-agent.deb",
	"/install/deb/amd64/istio-sidecar.deb",
	"/install/rpm/amd64/onboarding-agent.rpm",
	"/install/rpm/amd64/istio-sidecar.rpm",
	"/install/deb/arm64/onboarding-agent.deb",
	"/install/deb/arm64/istio-sidecar.deb",
	"/install/rpm/arm64/onboarding-agent.rpm",
	"/install/rpm/arm64/istio-sidecar.rpm",
	"/install/istio-sidecar/canary/deb/amd64/istio-sidecar.deb",
	"/install/istio-sidecar/canary/rpm/amd64/istio-sidecar.rpm",
	"/install/istio-sidecar/1-30-0/deb/arm64/istio-sidecar.deb",
}

// newRepo fills a directory with a distinct file for every seed path and
// serves it over TLS.
func newRepo(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	dir := t.TempDir()
	for _, p := range seedPaths {
		f := filepath.Join(dir, strings.TrimPrefix(p, Prefix))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(strings.Repeat("package "+p+"\n", 100)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h, err := New(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv, dir
}

// As the VM install guide's commands: curl -fLO the package and its .sha256,
// then sha256sum --check.
func TestCurlAndSha256sumCheck(t *testing.T) {
	for _, tool := range []string{"curl", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install -y curl coreutils): %v", tool, err)
		}
	}
	srv, _ := newRepo(t)
	for _, p := range seedPaths {
		t.Run(p, func(t *testing.T) {
			work := t.TempDir()
			for _, u := range []string{p, p + ChecksumSuffix} {
				cmd := exec.CommandContext(t.Context(), "curl", "-fLO", "--insecure", "--silent", "--show-error", srv.URL+u)
				cmd.Dir = work
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("curl -fLO %s: %v\n%s", u, err, out)
				}
			}
			cmd := exec.CommandContext(t.Context(), "sha256sum", "--check", filepath.Base(p)+ChecksumSuffix)
			cmd.Dir = work
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), filepath.Base(p)+": OK") {
				t.Fatalf("sha256sum --check: %v\n%s", err, out)
			}
		})
	}
}

func TestChecksumFormatAndTamperDetection(t *testing.T) {
	srv, dir := newRepo(t)
	c := srv.Client()
	get := func(p string) string {
		res, err := c.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", p, res.StatusCode)
		}
		return string(b)
	}
	const p = "/install/deb/amd64/onboarding-agent.deb"
	body := get(p)
	want := sha256.Sum256([]byte(body))
	if got := get(p + ChecksumSuffix); got != hex.EncodeToString(want[:])+"  onboarding-agent.deb\n" {
		t.Errorf("checksum file %q", got)
	}
	// Replacing the package changes the checksum.
	if err := os.WriteFile(filepath.Join(dir, "deb/amd64/onboarding-agent.deb"), []byte("new build, other size"), 0o644); err != nil {
		t.Fatal(err)
	}
	next := sha256.Sum256([]byte("new build, other size"))
	if got := get(p + ChecksumSuffix); !strings.HasPrefix(got, hex.EncodeToString(next[:])) {
		t.Errorf("checksum not recomputed after replacement: %q", got)
	}
}

// A package rewritten in place with the same size and modification time
// (a rebuild whose tooling pins timestamps, or `touch -d`) gets its new
// checksum and ETag: they follow the content.
func TestChecksumFollowsContentAtSameSizeAndTime(t *testing.T) {
	srv, dir := newRepo(t)
	c := srv.Client()
	file := filepath.Join(dir, "deb/amd64/onboarding-agent.deb")
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	const p = "/install/deb/amd64/onboarding-agent.deb"
	fetch := func(path string) (string, string) {
		t.Helper()
		res, err := c.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b), res.Header.Get("ETag")
	}
	old, oldTag := fetch(p)
	oldSum, _ := fetch(p + ChecksumSuffix)
	tampered := []byte(strings.Repeat("X", len(old)))
	if err := os.WriteFile(file, tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(file, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Stat(file); again.Size() != info.Size() || !again.ModTime().Equal(info.ModTime()) {
		t.Fatal("setup: size or modification time differs")
	}
	body, tag := fetch(p)
	sum, _ := fetch(p + ChecksumSuffix)
	want := sha256.Sum256(tampered)
	if body != string(tampered) || tag == oldTag || tag != `"`+hex.EncodeToString(want[:])+`"` {
		t.Errorf("ETag %s after the rewrite (before %s), want the new content's SHA-256", tag, oldTag)
	}
	if sum == oldSum || !strings.HasPrefix(sum, hex.EncodeToString(want[:])) {
		t.Errorf("checksum file %q after the rewrite, want the new content's", sum)
	}
}

func TestRangeAndCaching(t *testing.T) {
	srv, _ := newRepo(t)
	c := srv.Client()
	const p = "/install/rpm/arm64/istio-sidecar.rpm"
	req, _ := http.NewRequest(http.MethodGet, srv.URL+p, nil)
	req.Header.Set("Range", "bytes=0-6")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusPartialContent || string(b) != "package" {
		t.Errorf("range: %d %q", res.StatusCode, b)
	}
	etag, lm := res.Header.Get("ETag"), res.Header.Get("Last-Modified")
	if etag == "" || lm == "" || res.Header.Get("Cache-Control") != "no-cache" || res.Header.Get("Content-Type") != "application/x-rpm" {
		t.Errorf("headers %v", res.Header)
	}
	for _, h := range []struct{ name, value string }{{"If-None-Match", etag}, {"If-Modified-Since", lm}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+p, nil)
		req.Header.Set(h.name, h.value)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNotModified {
			t.Errorf("%s: %d, want 304", h.name, res.StatusCode)
		}
	}
	req, _ = http.NewRequest(http.MethodPost, srv.URL+p, nil)
	res, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", res.StatusCode)
	}
}

func TestUnknownAndTraversalPathsAre404(t *testing.T) {
	srv, dir := newRepo(t)
	// A secret beside the repository, and a symlink inside pointing at it.
	secret := filepath.Join(filepath.Dir(dir), "secret.deb")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "deb/arm64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "deb/arm64/istio-sidecar.deb")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "deb/arm64/istio-sidecar.deb")); err != nil {
		t.Fatal(err)
	}
	c := srv.Client()
	for _, p := range []string{
		"/", "/install/", "/install/deb/amd64/", "/install/deb/amd64/other.deb", "/install/deb/amd64/onboarding-agent.rpm",
		"/install/deb/s390x/onboarding-agent.deb", "/install/deb/amd64/onboarding-agent.deb.md5",
		"/install/deb/amd64/../../../secret.deb", "/install/deb/amd64/%2e%2e/%2e%2e/%2e%2e/secret.deb",
		"/install/deb/amd64/..%2f..%2f..%2fsecret.deb", "/install/istio-sidecar/../deb/amd64/istio-sidecar.deb",
		"/install/istio-sidecar/UPPER/deb/amd64/istio-sidecar.deb", "/install/istio-sidecar/canary/deb/amd64/onboarding-agent.deb",
		"/install/istio-sidecar/missing/deb/amd64/istio-sidecar.deb",
		"/install/deb/arm64/istio-sidecar.deb", // the symlink out of the directory
		"/install/deb/arm64/istio-sidecar.deb.sha256",
	} {
		res, err := c.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound || strings.Contains(string(b), "secret") {
			t.Errorf("GET %s: %d %q, want 404", p, res.StatusCode, b)
		}
	}
}

func TestNewNeedsTheDirectory(t *testing.T) {
	if _, err := New(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Error("missing directory accepted")
	}
}
