package repository

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"

	"github.com/embark-mesh/embark/onboarding/repository/internal/pkgtest"
	"github.com/embark-mesh/embark/onboarding/repository/signing"
)

// signedRepo serves dir with a new signing key; it returns the server and
// the public keys a client trusts.
func signedRepo(t *testing.T, dir string) (*httptest.Server, openpgp.EntityList, *Handler) {
	t.Helper()
	priv, _ := pkgtest.Key(t, "repository")
	_, next := pkgtest.Key(t, "next")
	s, err := signing.New(priv, next)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(dir, slog.New(slog.DiscardHandler), WithSigner(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	keys, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(get(t, srv, "/install/repository.asc", http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("repository.asc has %d keys, want the signing key and the published one", len(keys))
	}
	return srv, keys, h
}

func get(t *testing.T, srv *httptest.Server, p string, want int) []byte {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %s, want %d", p, resp.Status, want)
	}
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	f := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func fill(t *testing.T, dir, version string) {
	t.Helper()
	for arch, rpmArch := range map[string]string{"amd64": "x86_64", "arm64": "aarch64"} {
		for _, name := range []string{"onboarding-agent", "istio-sidecar"} {
			writeFile(t, dir, "deb/"+arch+"/"+name+".deb", pkgtest.Deb(pkgtest.DebControl(name, version, arch)))
			writeFile(t, dir, "rpm/"+arch+"/"+name+".rpm", pkgtest.SimpleRPM(name, version, rpmArch))
		}
	}
	writeFile(t, dir, "istio-sidecar/canary/deb/amd64/istio-sidecar.deb", pkgtest.Deb(pkgtest.DebControl("istio-sidecar", "1.31.0", "amd64")))
	writeFile(t, dir, "istio-sidecar/canary/rpm/amd64/istio-sidecar.rpm", pkgtest.SimpleRPM("istio-sidecar", "1.31.0", "x86_64"))
}

// aptSuite verifies a suite as apt does: InRelease's signature, then every
// index by the SHA256 the Release lists, and returns the Packages files by
// architecture.
func aptSuite(t *testing.T, srv *httptest.Server, keys openpgp.EntityList, suite string) (map[string]string, string) {
	t.Helper()
	in := get(t, srv, "/install/dists/"+suite+"/InRelease", http.StatusOK)
	b, _ := clearsign.Decode(in)
	if b == nil {
		t.Fatalf("%s InRelease is not clear-signed", suite)
	}
	if _, err := b.VerifySignature(keys, nil); err != nil {
		t.Fatalf("%s InRelease: %v", suite, err)
	}
	release := get(t, srv, "/install/dists/"+suite+"/Release", http.StatusOK)
	if !bytes.Equal(bytes.TrimRight(b.Plaintext, "\n"), bytes.TrimRight(release, "\n")) {
		t.Fatalf("%s: InRelease and Release differ", suite)
	}
	sig := get(t, srv, "/install/dists/"+suite+"/Release.gpg", http.StatusOK)
	if _, err := openpgp.CheckArmoredDetachedSignature(keys, bytes.NewReader(release), bytes.NewReader(sig), nil); err != nil {
		t.Fatalf("%s Release.gpg: %v", suite, err)
	}
	packages := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(release))
	inSHA := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") {
			inSHA = line == "SHA256:"
			continue
		}
		if !inSHA {
			continue
		}
		f := strings.Fields(line)
		data := get(t, srv, "/install/dists/"+suite+"/"+f[2], http.StatusOK)
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != f[0] {
			t.Fatalf("%s/%s: checksum differs from the Release", suite, f[2])
		}
		byHash := get(t, srv, "/install/dists/"+suite+"/"+filepath.Dir(f[2])+"/by-hash/SHA256/"+f[0], http.StatusOK)
		if !bytes.Equal(byHash, data) {
			t.Fatalf("%s/%s: by-hash differs", suite, f[2])
		}
		if strings.HasSuffix(f[2], "/Packages") {
			packages[strings.TrimPrefix(filepath.Dir(f[2]), "main/binary-")] = string(data)
		}
	}
	return packages, string(release)
}

func TestAptMetadata(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, "1.0")
	srv, keys, _ := signedRepo(t, dir)

	stable, release := aptSuite(t, srv, keys, StableSuite)
	for _, want := range []string{"Suite: stable", "Architectures: amd64 arm64", "Components: main", "Acquire-By-Hash: yes"} {
		if !strings.Contains(release, want+"\n") {
			t.Errorf("Release lacks %q:\n%s", want, release)
		}
	}
	for _, arch := range []string{"amd64", "arm64"} {
		p := stable[arch]
		for _, name := range []string{"onboarding-agent", "istio-sidecar"} {
			file := "deb/" + arch + "/" + name + ".deb"
			data, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			if !strings.Contains(p, "Package: "+name+"\n") || !strings.Contains(p, "Filename: "+file+"\n") || !strings.Contains(p, "SHA256: "+hex.EncodeToString(sum[:])+"\n") {
				t.Errorf("%s Packages lacks %s:\n%s", arch, file, p)
			}
		}
	}
	// The revision's suite: the agent and that revision's sidecar.
	canary, _ := aptSuite(t, srv, keys, RevisionSuitePrefix+"canary")
	if p := canary["amd64"]; !strings.Contains(p, "Filename: deb/amd64/onboarding-agent.deb\n") || !strings.Contains(p, "Filename: istio-sidecar/canary/deb/amd64/istio-sidecar.deb\n") || strings.Contains(p, "Filename: deb/amd64/istio-sidecar.deb") {
		t.Errorf("revision-canary amd64 Packages:\n%s", p)
	}
	get(t, srv, "/install/dists/revision-stable/InRelease", http.StatusNotFound)
	get(t, srv, "/install/dists/testing/InRelease", http.StatusNotFound)
}

// yumRepo verifies a yum repository as dnf does (repomd.xml.asc, then each
// file's checksum) and returns primary.xml.
func yumRepo(t *testing.T, srv *httptest.Server, keys openpgp.EntityList, base string) string {
	t.Helper()
	repomd := get(t, srv, base+"repodata/repomd.xml", http.StatusOK)
	sig := get(t, srv, base+"repodata/repomd.xml.asc", http.StatusOK)
	if _, err := openpgp.CheckArmoredDetachedSignature(keys, bytes.NewReader(repomd), bytes.NewReader(sig), nil); err != nil {
		t.Fatalf("%srepodata/repomd.xml.asc: %v", base, err)
	}
	var md struct {
		Data []struct {
			Type     string `xml:"type,attr"`
			Checksum string `xml:"checksum"`
			Open     string `xml:"open-checksum"`
			Location struct {
				Href string `xml:"href,attr"`
			} `xml:"location"`
		} `xml:"data"`
	}
	if err := xml.Unmarshal(repomd, &md); err != nil {
		t.Fatal(err)
	}
	var primary string
	for _, d := range md.Data {
		z := get(t, srv, base+d.Location.Href, http.StatusOK)
		if sum := sha256.Sum256(z); hex.EncodeToString(sum[:]) != d.Checksum {
			t.Fatalf("%s: checksum", d.Location.Href)
		}
		zr, err := gzip.NewReader(bytes.NewReader(z))
		if err != nil {
			t.Fatal(err)
		}
		plain, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(plain); hex.EncodeToString(sum[:]) != d.Open {
			t.Fatalf("%s: open checksum", d.Location.Href)
		}
		var doc struct{}
		if err := xml.Unmarshal(plain, &doc); err != nil {
			t.Fatalf("%s: %v", d.Location.Href, err)
		}
		if d.Type == "primary" {
			primary = string(plain)
		}
	}
	if primary == "" {
		t.Fatal("repomd.xml names no primary")
	}
	return primary
}

func TestYumMetadata(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, "1.0")
	srv, keys, _ := signedRepo(t, dir)
	primary := yumRepo(t, srv, keys, "/install/rpm/")
	for _, want := range []string{`packages="4"`, `<location href="amd64/onboarding-agent.rpm"/>`, `<location href="arm64/istio-sidecar.rpm"/>`,
		`<arch>aarch64</arch>`, `<version epoch="0" ver="1.0" rel="1"/>`, `&lt;built&gt; &amp; &#34;quoted&#34;.`,
		`<rpm:entry name="/bin/sh" pre="1"/>`, `<file>/usr/bin/onboarding-agent</file>`, `<rpm:entry name="onboarding-agent" flags="EQ" epoch="0" ver="1.0" rel="1"/>`} {
		if !strings.Contains(primary, want) {
			t.Errorf("primary lacks %s:\n%s", want, primary)
		}
	}
	if strings.Contains(primary, "rpmlib(") {
		t.Error("primary lists rpmlib() requirements")
	}
	canary := yumRepo(t, srv, keys, "/install/istio-sidecar/canary/rpm/")
	if !strings.Contains(canary, `packages="1"`) || !strings.Contains(canary, `<location href="amd64/istio-sidecar.rpm"/>`) {
		t.Errorf("canary primary:\n%s", canary)
	}
}

// A package added, replaced or removed is in the next request's metadata;
// the content-addressed files of the previous generation stay served (a
// client between InRelease and Packages finishes its update).
func TestMetadataFollowsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, "1.0")
	srv, keys, _ := signedRepo(t, dir)
	before, _ := aptSuite(t, srv, keys, StableSuite)
	oldSum := sha256.Sum256([]byte(before["amd64"]))
	oldInRelease := get(t, srv, "/install/dists/stable/InRelease", http.StatusOK)

	// Replaced in place, same size and modification time: still noticed.
	f := filepath.Join(dir, "deb/amd64/onboarding-agent.deb")
	info, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "deb/amd64/onboarding-agent.deb", pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "2.0", "amd64")))
	if err := os.Chtimes(f, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	after, _ := aptSuite(t, srv, keys, StableSuite)
	if !strings.Contains(after["amd64"], "Version: 2.0\n") || strings.Contains(after["amd64"], "Package: onboarding-agent\nVersion: 1.0\n") {
		t.Fatalf("Packages after the replacement:\n%s", after["amd64"])
	}
	if bytes.Equal(oldInRelease, get(t, srv, "/install/dists/stable/InRelease", http.StatusOK)) {
		t.Fatal("InRelease unchanged")
	}
	get(t, srv, "/install/dists/stable/main/binary-amd64/by-hash/SHA256/"+hex.EncodeToString(oldSum[:]), http.StatusOK)

	// Removed: gone from the index; the revision directory removed: its
	// suite is gone.
	if err := os.Remove(filepath.Join(dir, "deb/arm64/istio-sidecar.deb")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "istio-sidecar")); err != nil {
		t.Fatal(err)
	}
	after, _ = aptSuite(t, srv, keys, StableSuite)
	if strings.Contains(after["arm64"], "istio-sidecar") {
		t.Fatalf("removed package still indexed:\n%s", after["arm64"])
	}
	get(t, srv, "/install/dists/revision-canary/InRelease", http.StatusNotFound)
	get(t, srv, "/install/istio-sidecar/canary/rpm/repodata/repomd.xml", http.StatusNotFound)
}

// A package whose name or architecture is not the one its path says, or
// that is no package, is left out of the metadata (and still served as a
// file).
func TestMismatchedPackagesLeftOut(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "deb/amd64/onboarding-agent.deb", pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "1.0", "arm64")))
	writeFile(t, dir, "deb/arm64/onboarding-agent.deb", pkgtest.Deb(pkgtest.DebControl("something-else", "1.0", "arm64")))
	writeFile(t, dir, "deb/arm64/istio-sidecar.deb", []byte("not a package"))
	writeFile(t, dir, "rpm/amd64/onboarding-agent.rpm", pkgtest.SimpleRPM("onboarding-agent", "1.0", "aarch64"))
	writeFile(t, dir, "rpm/arm64/onboarding-agent.rpm", pkgtest.SimpleRPM("onboarding-agent", "1.0", "aarch64"))
	srv, keys, _ := signedRepo(t, dir)
	p, _ := aptSuite(t, srv, keys, StableSuite)
	if p["amd64"] != "" || p["arm64"] != "" {
		t.Fatalf("mismatched packages indexed: %q", p)
	}
	primary := yumRepo(t, srv, keys, "/install/rpm/")
	if !strings.Contains(primary, `packages="1"`) || !strings.Contains(primary, "arm64/onboarding-agent.rpm") {
		t.Fatalf("primary:\n%s", primary)
	}
	get(t, srv, "/install/deb/arm64/istio-sidecar.deb", http.StatusOK)
}

// Without a signing key no metadata is served: never an unsigned index.
func TestNoSignerNoMetadata(t *testing.T) {
	srv, _ := newRepo(t)
	for _, p := range []string{"/install/dists/stable/InRelease", "/install/dists/stable/Release", "/install/dists/stable/main/binary-amd64/Packages",
		"/install/rpm/repodata/repomd.xml", "/install/repository.asc"} {
		resp, err := srv.Client().Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s without a signing key: %s, want 404", p, resp.Status)
		}
	}
}

// Concurrent requests while packages change: every InRelease served is
// signed and consistent with the Packages it names (by-hash), under -race.
func TestConcurrentRegeneration(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, "1.0")
	srv, keys, _ := signedRepo(t, dir)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			writeFile(t, dir, "deb/amd64/onboarding-agent.deb", pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "1."+strings.Repeat("1", i+1), "amd64")))
		}
	}()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 10 {
				in, err := http.Get(srv.URL + "/install/dists/stable/InRelease")
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(in.Body)
				_ = in.Body.Close()
				b, _ := clearsign.Decode(body)
				if b == nil {
					errs <- io.ErrUnexpectedEOF
					return
				}
				if _, err := b.VerifySignature(keys, nil); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	<-done
	aptSuite(t, srv, keys, StableSuite)
}

// The apt Release is valid for the configured validity from its Date, and
// is generated and signed again, with new dates, once half of it has
// passed, although no package changed; until then it is served as it is.
func TestReleaseValidUntilAndRefresh(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, "1.0")
	priv, _ := pkgtest.Key(t, "repository")
	s, err := signing.New(priv)
	if err != nil {
		t.Fatal(err)
	}
	const validity = 48 * time.Hour
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var now atomic.Int64
	now.Store(start.Unix())
	h, err := New(dir, slog.New(slog.DiscardHandler), WithSigner(s), WithValidity(validity),
		WithClock(func() time.Time { return time.Unix(now.Load(), 0) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	keys, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(get(t, srv, "/install/repository.asc", http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		at       time.Duration // since start
		wantDate time.Duration // since start
	}{
		{name: "first generated", at: 0, wantDate: 0},
		{name: "just before half its validity: the same", at: validity/2 - time.Second, wantDate: 0},
		{name: "half its validity: signed again", at: validity / 2, wantDate: validity / 2},
		{name: "later, before the new half: the same", at: validity/2 + 20*time.Hour, wantDate: validity / 2},
		{name: "the new half: signed again", at: validity, wantDate: validity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now.Store(start.Add(tt.at).Unix())
			_, release := aptSuite(t, srv, keys, StableSuite)
			date, validUntil := releaseTime(t, release, "Date"), releaseTime(t, release, "Valid-Until")
			if want := start.Add(tt.wantDate); !date.Equal(want) {
				t.Errorf("Date %v, want %v", date, want)
			}
			if got := validUntil.Sub(date); got != validity {
				t.Errorf("Valid-Until - Date = %v, want %v", got, validity)
			}
			if !validUntil.After(start.Add(tt.at).Add(validity/2 - time.Second)) {
				t.Errorf("served with Valid-Until %v, less than half its validity after %v", validUntil, start.Add(tt.at))
			}
		})
	}
}

func TestDefaultValidity(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Hour} {
		h, err := New(t.TempDir(), nil, WithValidity(d))
		if err != nil {
			t.Fatal(err)
		}
		if h.validity != DefaultValidity {
			t.Errorf("WithValidity(%v): validity %v, want %v", d, h.validity, DefaultValidity)
		}
		_ = h.Close()
	}
}

// releaseTime parses the Release field name (an RFC 1123 date).
func releaseTime(t *testing.T, release, name string) time.Time {
	t.Helper()
	for line := range strings.Lines(release) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), name+": "); ok {
			at, err := time.Parse(time.RFC1123, v)
			if err != nil {
				t.Fatalf("%s %q: %v", name, v, err)
			}
			return at
		}
	}
	t.Fatalf("Release has no %s:\n%s", name, release)
	return time.Time{}
}
