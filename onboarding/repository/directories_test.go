package repository

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"

	"github.com/embark-mesh/embark/onboarding/repository/internal/pkgtest"
	"github.com/embark-mesh/embark/onboarding/repository/signing"
)

// The agent's packages in the first directory (the image's) and Istio's
// istio-sidecar packages in an extra one (the operator's volume) are
// served as one repository: each file from the directory that has it, a
// file of the first never replaced by the extra one's, and the signed apt
// and yum metadata list the packages of both, a revision of the extra
// directory included.
func TestExtraDirectories(t *testing.T) {
	image, volume := t.TempDir(), t.TempDir()
	agent := pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "1.0", "amd64"))
	writeFile(t, image, "deb/amd64/onboarding-agent.deb", agent)
	writeFile(t, image, "rpm/amd64/onboarding-agent.rpm", pkgtest.SimpleRPM("onboarding-agent", "1.0", "x86_64"))
	sidecar := pkgtest.Deb(pkgtest.DebControl("istio-sidecar", "1.30.0", "amd64"))
	writeFile(t, volume, "deb/amd64/istio-sidecar.deb", sidecar)
	writeFile(t, volume, "rpm/amd64/istio-sidecar.rpm", pkgtest.SimpleRPM("istio-sidecar", "1.30.0", "x86_64"))
	writeFile(t, volume, "istio-sidecar/canary/deb/amd64/istio-sidecar.deb", pkgtest.Deb(pkgtest.DebControl("istio-sidecar", "1.31.0", "amd64")))
	// The volume's own agent package loses to the image's.
	writeFile(t, volume, "deb/amd64/onboarding-agent.deb", pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "0.9", "amd64")))

	priv, _ := pkgtest.Key(t, "repository")
	s, err := signing.New(priv)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(image, slog.New(slog.DiscardHandler), WithSigner(s), WithExtraDirectories(volume))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	if got := get(t, srv, "/install/deb/amd64/onboarding-agent.deb", http.StatusOK); !bytes.Equal(got, agent) {
		t.Error("the agent package is not the first directory's")
	}
	if got := get(t, srv, "/install/deb/amd64/istio-sidecar.deb", http.StatusOK); !bytes.Equal(got, sidecar) {
		t.Error("the sidecar package is not the extra directory's")
	}
	sum := sha256.Sum256(sidecar)
	if got := string(get(t, srv, "/install/deb/amd64/istio-sidecar.deb.sha256", http.StatusOK)); got != hex.EncodeToString(sum[:])+"  istio-sidecar.deb\n" {
		t.Errorf("sidecar checksum %q", got)
	}
	get(t, srv, "/install/deb/arm64/istio-sidecar.deb", http.StatusNotFound)

	keys, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(get(t, srv, "/install/repository.asc", http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	stable, _ := aptSuite(t, srv, keys, StableSuite)
	for _, want := range []string{"Package: onboarding-agent\nVersion: 1.0\n", "Filename: deb/amd64/onboarding-agent.deb\n", "Filename: deb/amd64/istio-sidecar.deb\n"} {
		if !strings.Contains(stable["amd64"], want) {
			t.Errorf("stable amd64 Packages lacks %q:\n%s", want, stable["amd64"])
		}
	}
	if strings.Contains(stable["amd64"], "Version: 0.9") {
		t.Errorf("stable amd64 Packages lists the shadowed agent 0.9:\n%s", stable["amd64"])
	}
	canary, _ := aptSuite(t, srv, keys, RevisionSuitePrefix+"canary")
	if p := canary["amd64"]; !strings.Contains(p, "Filename: istio-sidecar/canary/deb/amd64/istio-sidecar.deb\n") || !strings.Contains(p, "Filename: deb/amd64/onboarding-agent.deb\n") {
		t.Errorf("revision-canary amd64 Packages:\n%s", p)
	}
	primary := yumRepo(t, srv, keys, "/install/rpm/")
	for _, want := range []string{`href="amd64/onboarding-agent.rpm"`, `href="amd64/istio-sidecar.rpm"`} {
		if !strings.Contains(primary, want) {
			t.Errorf("yum primary.xml lacks %s:\n%s", want, primary)
		}
	}
}

// A missing extra directory fails New, naming it.
func TestNewNeedsEveryDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "istio-sidecar-packages")
	_, err := New(t.TempDir(), nil, WithExtraDirectories(missing))
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("New with a missing extra directory: %v, want an error naming %s", err, missing)
	}
}
