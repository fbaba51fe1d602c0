package assemble

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"

	"github.com/embark-mesh/embark/test/tools/image/sbom"
	"github.com/embark-mesh/embark/test/tools/release/sign"
)

const repoRoot = "../../../.."

// release is the release directory under test: EMBARK_RELEASE_DIR (what
// `make release` wrote from `make image` and `make packages`), or one the
// test assembles from the real chart and small stand-ins for the image
// archive and the packages (the agent binary is the test binary, a Go
// binary with build information).
func release(t *testing.T) (dir string, real bool) {
	t.Helper()
	if dir := os.Getenv("EMBARK_RELEASE_DIR"); dir != "" {
		return dir, true
	}
	dir = filepath.Join(t.TempDir(), "release", version())
	if _, err := Assemble(standIns(t), dir); err != nil {
		t.Fatal(err)
	}
	return dir, false
}

// standIns are the options of a release from the real chart and small
// stand-ins for the image archive and the packages (the agent binary is
// the test binary, a Go binary with build information).
func standIns(t *testing.T) Options {
	t.Helper()
	in := t.TempDir()
	write(t, filepath.Join(in, "image", "build.json"), []byte(`{"version":"`+version()+`"}`))
	write(t, filepath.Join(in, "image", "digest"), []byte("sha256:"+strings.Repeat("ab", 32)+"\n"))
	write(t, filepath.Join(in, "image", imageArchive), []byte("an OCI archive"))
	write(t, filepath.Join(in, "image", "sbom", "onboarding-endpoint_linux_amd64.spdx.json"), []byte("{}\n"))
	exe := must(os.Executable())
	for _, arch := range []string{"amd64", "arm64"} {
		write(t, filepath.Join(in, "bin", "linux_"+arch, "onboarding-agent"), must(os.ReadFile(exe)))
		for _, format := range []string{"deb", "rpm"} {
			write(t, filepath.Join(in, "packages", format, arch, "onboarding-agent."+format), []byte(format+" "+arch))
		}
	}
	write(t, filepath.Join(in, "packages.asc"), pgpPrivateKey(t))
	s, _, err := sign.LoadOrGenerateKey(filepath.Join(in, "release.key"))
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		Version: version(), Source: "https://github.com/embark-mesh/embark",
		ChartDir: filepath.Join(repoRoot, "manifests/charts/embark"), ImageDir: filepath.Join(in, "image"),
		ImageName: "embark-mesh/onboarding-endpoint", PackagesDir: filepath.Join(in, "packages"),
		PackagesSigningKey: filepath.Join(in, "packages.asc"), BinDir: filepath.Join(in, "bin"),
		Arches: []string{"amd64", "arm64"}, Created: time.Unix(0, 0), Signer: s,
	}
}

// TestAssembleRefuses: outputs of another version or missing outputs are
// refused with an error that says what to run; the release directory is
// not created and no partial one is left.
func TestAssembleRefuses(t *testing.T) {
	tests := []struct {
		name    string
		change  func(t *testing.T, o *Options)
		wantErr string
	}{
		{name: "image of another version", change: func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.ImageDir, "build.json"), []byte(`{"version":"v9.9.9"}`))
		}, wantErr: `is version "v9.9.9", want "` + version() + `": run make image`},
		{name: "no image", change: func(t *testing.T, o *Options) { o.ImageDir = t.TempDir() }, wantErr: "run make image first"},
		{name: "chart of another version", change: func(t *testing.T, o *Options) {
			o.Version = "v9.9.9"
			write(t, filepath.Join(o.ImageDir, "build.json"), []byte(`{"version":"v9.9.9"}`))
		}, wantErr: "want v9.9.9: run make set-version"},
		{name: "no package", change: func(t *testing.T, o *Options) {
			if err := os.Remove(filepath.Join(o.PackagesDir, "rpm", "arm64", "onboarding-agent.rpm")); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "run make packages first"},
		{name: "agent binary not a Go binary", change: func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.BinDir, "linux_amd64", "onboarding-agent"), []byte("#!/bin/sh\n"))
		}, wantErr: "read Go build info"},
		{name: "package signing key not OpenPGP", change: func(t *testing.T, o *Options) {
			write(t, o.PackagesSigningKey, []byte("-----BEGIN EC PRIVATE KEY-----\n-----END EC PRIVATE KEY-----\n"))
		}, wantErr: "package signing key"},
		{name: "no signer", change: func(t *testing.T, o *Options) { o.Signer = nil }, wantErr: "signing key is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := standIns(t)
			tt.change(t, &opts)
			out := filepath.Join(t.TempDir(), "release")
			_, err := Assemble(opts, out)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			for _, dir := range []string{out, out + ".partial"} {
				if _, err := os.Stat(dir); err == nil {
					t.Errorf("%s exists after a refused release", dir)
				}
			}
		})
	}
}

// TestReleaseVerifiesOffline verifies a release with tools other than
// Embark's own, offline: openssl checks every cosign-format signature
// (cosign's blob signatures are plain ECDSA-SHA256 over the file, so
// `openssl dgst -sha256 -verify cosign.pub -signature <der>` is the same
// check as `cosign verify-blob --key cosign.pub`), `sha256sum -c` checks
// SHA256SUMS, and a file changed after signing fails both. Every artifact
// is present and signed, and each SBOM names its artifact by digest.
func TestReleaseVerifiesOffline(t *testing.T) {
	dir, real := release(t)
	names := listDir(t, dir)
	checkArtifacts(t, dir, names)

	for _, name := range names {
		if !strings.HasSuffix(name, SigSuffix) {
			continue
		}
		file := strings.TrimSuffix(name, SigSuffix)
		if out, err := opensslVerify(t, dir, file, filepath.Join(dir, file)); err != nil {
			t.Errorf("openssl does not verify %s: %v\n%s", name, err, out)
		}
	}
	if out, err := sha256sumCheck(dir); err != nil {
		t.Errorf("sha256sum -c %s: %v\n%s", SumsFile, err, out)
	}

	checkSBOMs(t, dir, real)
	if real {
		checkPackageSignatures(t, dir)
		checkImageDigest(t, dir)
		checkDocumentedCommands(t, dir)
	}
	checkTamperedFails(t, dir, names)
}

// checkArtifacts fails unless the release holds the chart, the image
// archive, the four packages, their SBOMs, SHA256SUMS and cosign.pub, and
// every file but cosign.pub and the signatures has a signature.
func checkArtifacts(t *testing.T, dir string, names []string) {
	t.Helper()
	version := version()
	pkgVersion := strings.TrimPrefix(version, "v")
	want := []string{SumsFile, PublicKeyFile, RepositoryKeyFile, "embark-" + pkgVersion + ".tgz", "embark-" + pkgVersion + ".tgz.spdx.json",
		"onboarding-endpoint_" + version + ".oci.tar", "onboarding-endpoint_" + version + ".digest", "onboarding-endpoint_linux_amd64.spdx.json"}
	for _, arch := range []string{"amd64", "arm64"} {
		for _, format := range []string{"deb", "rpm"} {
			p := "onboarding-agent_" + pkgVersion + "_linux_" + arch + "." + format
			want = append(want, p, p+".spdx.json")
		}
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("release lacks %s; it has %v", w, names)
		}
	}
	for _, n := range names {
		signed := have[n+SigSuffix]
		if wantSigned := n != PublicKeyFile && !strings.HasSuffix(n, SigSuffix); signed != wantSigned {
			t.Errorf("%s: signed %v, want %v", n, signed, wantSigned)
		}
	}
}

// checkSBOMs fails unless each package's and the chart's SBOM describes
// its file by its SHA-256. On `make release`'s output the binary the
// package SBOM describes must be the one inside the package, as dpkg-deb
// and rpm read it.
func checkSBOMs(t *testing.T, dir string, real bool) {
	t.Helper()
	sboms, _ := filepath.Glob(filepath.Join(dir, "*.tgz.spdx.json"))
	pkgs, _ := filepath.Glob(filepath.Join(dir, "onboarding-agent_*.spdx.json"))
	if len(sboms) != 1 || len(pkgs) != 4 {
		t.Fatalf("chart SBOMs %v, package SBOMs %v; want 1 and 4", sboms, pkgs)
	}
	for _, path := range append(sboms, pkgs...) {
		var doc sbom.Document
		if err := json.Unmarshal(must(os.ReadFile(path)), &doc); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		artifact := strings.TrimSuffix(path, SBOMSuffix)
		described := describedPackage(t, doc)
		if described.PackageFileName != filepath.Base(artifact) || checksum(described) != sha256File(t, artifact) {
			t.Errorf("%s describes %s sha256 %s, want %s sha256 %s", filepath.Base(path), described.PackageFileName, checksum(described), filepath.Base(artifact), sha256File(t, artifact))
		}
		if real && strings.HasPrefix(filepath.Base(path), "onboarding-agent_") {
			binary := packaged(t, artifact)
			if sbomBinary := checksum(packageByID(doc, "SPDXRef-Package-main")); binary != sbomBinary {
				t.Errorf("%s: /usr/bin/onboarding-agent in the package has sha256 %s, the SBOM describes %s", filepath.Base(path), binary, sbomBinary)
			}
		}
	}
}

// packaged is the SHA-256 of /usr/bin/onboarding-agent in a DEB (read by
// dpkg-deb and tar) or RPM (the file digest rpm recorded).
func packaged(t *testing.T, pkg string) string {
	t.Helper()
	if strings.HasSuffix(pkg, ".deb") {
		out, err := exec.Command("sh", "-c", `dpkg-deb --fsys-tarfile "$1" | tar -xO ./usr/bin/onboarding-agent | sha256sum`, "sh", pkg).Output()
		if err != nil {
			t.Fatalf("dpkg-deb %s: %v", pkg, err)
		}
		return strings.Fields(string(out))[0]
	}
	out, err := exec.Command("rpm", "-qp", "--qf", "%{FILEDIGESTALGO}\n[%{FILENAMES} %{FILEDIGESTS}\n]", pkg).Output()
	if err != nil {
		t.Fatalf("rpm -qp %s: %v", pkg, err)
	}
	lines := strings.Split(string(out), "\n")
	if lines[0] != "8" { // PGPHASHALGO_SHA256
		t.Fatalf("%s: file digests are algorithm %s, want 8 (SHA-256)", pkg, lines[0])
	}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "/usr/bin/onboarding-agent" {
			return f[1]
		}
	}
	t.Fatalf("%s has no /usr/bin/onboarding-agent:\n%s", pkg, out)
	return ""
}

// checkPackageSignatures verifies each package's own OpenPGP signature
// with the distributions' verifiers and only the published repository.asc:
// rpmkeys --checksig against a database holding that key, and gpgv on a
// DEB's _gpgorigin member over its other members (what debsig-verify
// checks).
func checkPackageSignatures(t *testing.T, dir string) {
	t.Helper()
	work := t.TempDir()
	key := filepath.Join(dir, RepositoryKeyFile)
	command(t, work, "rpmkeys", "--dbpath", filepath.Join(work, "rpmdb"), "--import", key)
	command(t, work, "gpg", "--batch", "--yes", "--output", filepath.Join(work, "repository.gpg"), "--dearmor", key)
	rpms, _ := filepath.Glob(filepath.Join(dir, "*.rpm"))
	for _, rpm := range rpms {
		out := command(t, work, "rpmkeys", "--dbpath", filepath.Join(work, "rpmdb"), "--checksig", "-v", rpm)
		if !strings.Contains(out, "Signature, key ID") || !strings.Contains(out, ": OK") {
			t.Errorf("%s: no signature verified by %s:\n%s", filepath.Base(rpm), RepositoryKeyFile, out)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	for _, deb := range debs {
		members := strings.Fields(command(t, work, "ar", "t", deb))
		if len(members) == 0 || members[len(members)-1] != "_gpgorigin" {
			t.Errorf("%s has no _gpgorigin signature: %v", filepath.Base(deb), members)
			continue
		}
		write(t, filepath.Join(work, "origin.asc"), []byte(command(t, work, "ar", "p", deb, "_gpgorigin")))
		write(t, filepath.Join(work, "signed"), []byte(command(t, work, "ar", append([]string{"p", deb}, members[:len(members)-1]...)...)))
		command(t, work, "gpgv", "--keyring", filepath.Join(work, "repository.gpg"), filepath.Join(work, "origin.asc"), filepath.Join(work, "signed"))
	}
}

// command runs a command in dir and returns its stdout; it fails the test
// when the command fails.
func command(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GNUPGHOME="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	return string(out) + stderr.String()
}

// pgpPrivateKey is a new armored OpenPGP private key, standing in for the
// packages' signing key.
func pgpPrivateKey(t *testing.T) []byte {
	t.Helper()
	e, err := openpgp.NewEntity("Embark test", "", "embark-test@example.invalid", nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := armor.Encode(&buf, openpgp.PrivateKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// checkImageDigest fails unless the published digest is the one the OCI
// archive's index.json names (read with tar), the digest a registry
// reports once the archive is pushed.
func checkImageDigest(t *testing.T, dir string) {
	t.Helper()
	prefix := filepath.Join(dir, "onboarding-endpoint_"+version())
	index := command(t, dir, "tar", "-xOf", prefix+".oci.tar", "index.json")
	var idx struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal([]byte(index), &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json of the archive: %v\n%s", err, index)
	}
	if want := strings.TrimSpace(string(must(os.ReadFile(prefix + ".digest")))); idx.Manifests[0].Digest != want {
		t.Errorf("archive's index names %s, the release's digest file says %s", idx.Manifests[0].Digest, want)
	}
}

// checkDocumentedCommands runs the verification commands of
// docs/install.md ("Verifying a release") in a copy of the release, as a
// user would, with V set to this release: a docs change that breaks them
// fails here. `crane digest` needs a registry and is left out; `cosign`
// runs only where it is installed.
func checkDocumentedCommands(t *testing.T, dir string) {
	t.Helper()
	doc := string(must(os.ReadFile(filepath.Join(repoRoot, "docs/install.md"))))
	_, section, ok := strings.Cut(doc, "\n## Verifying a release\n")
	if !ok {
		t.Fatal(`docs/install.md has no "## Verifying a release" section`)
	}
	_, block, ok := strings.Cut(section, "\n```sh\n")
	block, _, ok2 := strings.Cut(block, "\n```\n")
	if !ok || !ok2 {
		t.Fatal(`docs/install.md "Verifying a release" has no sh block`)
	}
	_, cosignErr := exec.LookPath("cosign")
	var script []string
	for _, line := range strings.Split(block, "\n") {
		switch {
		case strings.HasPrefix(line, "V="):
			line = "V=" + version()
		case strings.HasPrefix(line, "crane "), strings.HasPrefix(line, "cosign ") && cosignErr != nil:
			continue
		}
		script = append(script, line)
	}
	work := t.TempDir()
	for _, n := range listDir(t, dir) {
		if err := os.Symlink(filepath.Join(must(filepath.Abs(dir)), n), filepath.Join(work, n)); err != nil {
			t.Fatal(err)
		}
	}
	out := command(t, work, "bash", "-euo", "pipefail", "-c", strings.Join(script, "\n"))
	for _, want := range []string{"Verified OK", "digests signatures OK", "Good signature"} {
		if !strings.Contains(out, want) {
			t.Errorf("the documented commands do not print %q:\n%s", want, out)
		}
	}
}

// checkTamperedFails changes one artifact after signing (in a copy of the
// release whose other files are symbolic links) and expects openssl and
// sha256sum -c to fail on it.
func checkTamperedFails(t *testing.T, dir string, names []string) {
	t.Helper()
	tampered := t.TempDir()
	victim := ""
	for _, n := range names {
		if strings.HasSuffix(n, ".tgz") {
			victim = n
			continue
		}
		if err := os.Symlink(filepath.Join(must(filepath.Abs(dir)), n), filepath.Join(tampered, n)); err != nil {
			t.Fatal(err)
		}
	}
	changed := append(must(os.ReadFile(filepath.Join(dir, victim))), 0)
	write(t, filepath.Join(tampered, victim), changed)

	if out, err := opensslVerify(t, tampered, victim, filepath.Join(tampered, victim)); err == nil || bytes.Contains(out, []byte("Verified OK")) {
		t.Errorf("openssl verifies the changed %s:\n%s", victim, out)
	}
	out, err := sha256sumCheck(tampered)
	if err == nil || !strings.Contains(string(out), victim+": FAILED") {
		t.Errorf("sha256sum -c passes the changed %s: %v\n%s", victim, err, out)
	}
}

// opensslVerify decodes file's base64 signature to DER and runs `openssl
// dgst -sha256 -verify cosign.pub -signature <der> <path>`.
func opensslVerify(t *testing.T, dir, file, path string) ([]byte, error) {
	t.Helper()
	der, err := base64.StdEncoding.DecodeString(string(must(os.ReadFile(filepath.Join(dir, file+SigSuffix)))))
	if err != nil {
		t.Fatalf("%s%s is not base64: %v", file, SigSuffix, err)
	}
	derFile := filepath.Join(t.TempDir(), file+".der")
	write(t, derFile, der)
	return exec.Command("openssl", "dgst", "-sha256", "-verify", filepath.Join(dir, PublicKeyFile), "-signature", derFile, path).CombinedOutput()
}

func sha256sumCheck(dir string) ([]byte, error) {
	cmd := exec.Command("sha256sum", "--strict", "-c", SumsFile)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

func describedPackage(t *testing.T, doc sbom.Document) sbom.Package {
	t.Helper()
	for _, r := range doc.Relationships {
		if r.Element == "SPDXRef-DOCUMENT" && r.Type == "DESCRIBES" {
			return packageByID(doc, r.Related)
		}
	}
	t.Fatalf("SBOM %q describes nothing", doc.Name)
	return sbom.Package{}
}

func packageByID(doc sbom.Document, id string) sbom.Package {
	for _, p := range doc.Packages {
		if p.SPDXID == id {
			return p
		}
	}
	return sbom.Package{}
}

func checksum(p sbom.Package) string {
	for _, c := range p.Checksums {
		if c.Algorithm == "SHA256" {
			return c.ChecksumValue
		}
	}
	return ""
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	sum := sha256.Sum256(must(os.ReadFile(path)))
	return hex.EncodeToString(sum[:])
}

// version is the release version, from the repository's VERSION file.
func version() string {
	return strings.TrimSpace(string(must(os.ReadFile(filepath.Join(repoRoot, "VERSION")))))
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
