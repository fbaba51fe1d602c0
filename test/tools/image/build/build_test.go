package build

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/embark-mesh/embark/test/tools/image/sbom"
)

// built is an image built once, by `make image` (EMBARK_IMAGE_DIR names its
// output directory) or by the test itself.
type built struct {
	dir  string
	opts Options
}

func buildOnce(t *testing.T) built {
	t.Helper()
	if dir := os.Getenv("EMBARK_IMAGE_DIR"); dir != "" {
		raw, err := os.ReadFile(filepath.Join(dir, InputsFile))
		if err != nil {
			t.Fatalf("EMBARK_IMAGE_DIR=%s: %v", dir, err)
		}
		var opts Options
		if err := json.Unmarshal(raw, &opts); err != nil {
			t.Fatalf("%s: %v", InputsFile, err)
		}
		return built{dir: dir, opts: opts}
	}
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		ModuleDir:   root,
		Package:     "./cmd/onboarding-endpoint",
		LDFlags:     "-X github.com/embark-mesh/embark/version.version=v0.0.0-test -X github.com/embark-mesh/embark/version.revision=0123456789abcdef",
		Name:        "embark-mesh/onboarding-endpoint",
		Version:     "v0.0.0-test",
		Revision:    "0123456789abcdef",
		Source:      "https://github.com/embark-mesh/embark",
		Created:     time.Unix(1767225600, 0).UTC(),
		PackagesDir: testPackages(t),
	}
	dir := t.TempDir()
	if _, err := Build(t.Context(), opts, dir); err != nil {
		t.Fatalf("build: %v", err)
	}
	return built{dir: dir, opts: opts}
}

// testPackages is the directory of agent packages the test's own build
// puts into the image: EMBARK_PACKAGES_DIR (make packages' output) when
// set, or else stand-ins that the image builder takes for packages (the
// DEB and RPM magic numbers, then bytes distinct per file): the builder
// copies bytes, it does not read packages.
func testPackages(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("EMBARK_PACKAGES_DIR"); dir != "" {
		return dir
	}
	dir := t.TempDir()
	for _, name := range AgentPackages {
		magic := map[string]string{".deb": "!<arch>\n", ".rpm": "\xed\xab\xee\xdb"}[filepath.Ext(name)]
		writeTestFile(t, filepath.Join(dir, name), []byte(magic+strings.Repeat("stand-in for "+name+"\n", 50)))
	}
	return dir
}

func writeTestFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestImage builds the image a second time from the same inputs and checks
// the digest and every byte agree, checks what the image holds, and runs the
// host platform's entrypoint from the image's own filesystem.
//
// The second build shares the Go build cache with the first (unless
// EMBARK_IMAGE_COLD_REBUILD is set: then it compiles every package, the
// standard library included, into an empty cache, which costs as much as a
// first build on a fresh machine). With the cache shared, the comparison
// proves what Embark's build adds is deterministic: the link of both
// binaries (run again: go build does not cache linked binaries), the
// version stamps, the SBOM, the layers' tar and gzip bytes, every
// timestamp, the configs, manifests, index and OCI archive. It does not
// prove that compiling the packages on another machine gives the same
// objects; that is the Go toolchain's own guarantee (reproducible builds
// since Go 1.21, with -trimpath as here), which the cold rebuild checks.
func TestImage(t *testing.T) {
	first := buildOnce(t)

	again := t.TempDir()
	opts := first.opts
	if os.Getenv("EMBARK_IMAGE_COLD_REBUILD") != "" {
		opts.Env = []string{"GOCACHE=" + filepath.Join(t.TempDir(), "gocache")}
		t.Logf("rebuilding with an empty Go build cache")
	}
	res, err := Build(t.Context(), opts, again)
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	wantDigest := strings.TrimSpace(string(mustRead(t, filepath.Join(first.dir, DigestFile))))
	t.Logf("first build %s, second build %s", wantDigest, res.Digest)
	if res.Digest.String() != wantDigest {
		t.Errorf("same inputs, different index digest: %s then %s", wantDigest, res.Digest)
	}
	for _, name := range []string{ArchiveName, filepath.Join(LayoutDir, "index.json")} {
		if !bytes.Equal(mustRead(t, filepath.Join(first.dir, name)), mustRead(t, filepath.Join(again, name))) {
			t.Errorf("same inputs, different %s", name)
		}
	}

	idx := checkLayout(t, first)
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var host v1.Image
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(desc.Platform.Architecture, func(t *testing.T) { checkImage(t, first, desc, img) })
		if desc.Platform.Architecture == runtime.GOARCH {
			host = img
		}
	}
	if host == nil {
		t.Fatalf("no image for the host architecture %s", runtime.GOARCH)
	}

	rootfs := filepath.Join(t.TempDir(), "rootfs")
	unpack(t, host, rootfs)
	cfg, err := host.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s %s (revision %s, ", first.opts.Binary(), first.opts.Version, first.opts.Revision)

	t.Run("entrypoint from the unpacked filesystem", func(t *testing.T) {
		args := append(append([]string(nil), cfg.Config.Entrypoint...), "--version")
		out, err := exec.CommandContext(t.Context(), filepath.Join(rootfs, args[0]), args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v --version: %v: %s", args, err, out)
		}
		if !strings.HasPrefix(string(out), want) {
			t.Errorf("--version printed %q, want it to start with %q", out, want)
		}
	})

	t.Run("runc", func(t *testing.T) {
		runc, err := exec.LookPath("runc")
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("runc is not installed (.ci/run installs it): %v", err)
			}
			t.Skip("runc is not installed: apt-get install runc")
		}
		out := runInRunc(t, runc, rootfs, cfg)
		if !strings.HasPrefix(out, want) {
			t.Errorf("runc: --version printed %q, want it to start with %q", out, want)
		}
	})
}

// checkLayout checks the OCI layout's index.json names one OCI image index
// by the version, and returns that index.
func checkLayout(t *testing.T, b built) v1.ImageIndex {
	t.Helper()
	lp, err := layout.FromPath(filepath.Join(b.dir, LayoutDir))
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1 (the image index)", len(tm.Manifests))
	}
	d := tm.Manifests[0]
	if d.MediaType != types.OCIImageIndex {
		t.Errorf("index.json entry is a %s, want %s", d.MediaType, types.OCIImageIndex)
	}
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != b.opts.Version {
		t.Errorf("ref.name %q, want %q", got, b.opts.Version)
	}
	if got := d.Digest.String(); got != strings.TrimSpace(string(mustRead(t, filepath.Join(b.dir, DigestFile)))) {
		t.Errorf("index.json names %s, the digest file says otherwise", got)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("image index media type %s", im.MediaType)
	}
	checkAnnotations(t, b, im.Annotations)
	var platforms []string
	for _, m := range im.Manifests {
		if m.MediaType != types.OCIManifestSchema1 || m.Platform == nil {
			t.Errorf("index entry %s: media type %s, platform %v", m.Digest, m.MediaType, m.Platform)
			continue
		}
		platforms = append(platforms, m.Platform.String())
	}
	if got, want := strings.Join(platforms, ","), "linux/amd64,linux/arm64/v8"; got != want {
		t.Errorf("platforms %s, want %s", got, want)
	}
	return idx
}

func checkAnnotations(t *testing.T, b built, got map[string]string) {
	t.Helper()
	want := map[string]string{
		"org.opencontainers.image.source":   b.opts.Source,
		"org.opencontainers.image.revision": b.opts.Revision,
		"org.opencontainers.image.version":  b.opts.Version,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.created":  b.opts.Created.Format(time.RFC3339),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

// checkImage checks one platform's image: its config, its files, that the
// binary is static and built as the Makefile says, and its SBOM.
func checkImage(t *testing.T, b built, desc v1.Descriptor, img v1.Image) {
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	checkAnnotations(t, b, m.Annotations)
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %s", m.Config.MediaType)
	}
	for _, l := range m.Layers {
		if l.MediaType != types.OCILayer {
			t.Errorf("layer media type %s", l.MediaType)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != desc.Platform.Architecture || cfg.OS != "linux" {
		t.Errorf("config platform %s/%s, index says %s", cfg.OS, cfg.Architecture, desc.Platform)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cfg.Config.User)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/usr/local/bin/onboarding-endpoint" {
		t.Errorf("entrypoint %q", got)
	}
	checkAnnotations(t, b, cfg.Config.Labels)
	if !cfg.Created.Time.Equal(b.opts.Created) {
		t.Errorf("created %s, want %s", cfg.Created.Time, b.opts.Created)
	}

	files := readFiles(t, img)
	for name, f := range files {
		if f.ModTime.Unix() != b.opts.Created.Unix() {
			t.Errorf("%s: mtime %s, want %s", name, f.ModTime, b.opts.Created)
		}
		if f.Uid != 0 && name != "home/nonroot" {
			t.Errorf("%s: owned by %d", name, f.Uid)
		}
	}
	for _, want := range []string{"etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt", "tmp", "usr/local/bin/onboarding-endpoint", "usr/share/doc/embark/onboarding-endpoint.spdx.json"} {
		if _, ok := files[want]; !ok {
			t.Errorf("image has no %s", want)
		}
	}
	if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no user 65532: %q", files["etc/passwd"].data)
	}
	if files["tmp"].Mode != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", files["tmp"].Mode)
	}
	checkRoots(t, files["etc/ssl/certs/ca-certificates.crt"].data)
	checkPackages(t, b, files)

	bin := files["usr/local/bin/onboarding-endpoint"]
	if bin.Mode != 0o755 {
		t.Errorf("binary mode %o, want 755", bin.Mode)
	}
	checkBinary(t, bin.data, desc.Platform.Architecture)

	var doc sbom.Document
	inImage := files["usr/share/doc/embark/onboarding-endpoint.spdx.json"].data
	if err := json.Unmarshal(inImage, &doc); err != nil {
		t.Fatalf("SBOM in the image: %v", err)
	}
	outside := mustRead(t, filepath.Join(b.dir, "sbom", "onboarding-endpoint_linux_"+desc.Platform.Architecture+".spdx.json"))
	if !bytes.Equal(inImage, outside) {
		t.Errorf("the SBOM inside the image differs from the one beside the layout")
	}
	checkSBOM(t, b, doc, bin.data)
}

// checkPackages checks the image carries exactly the agent's packages of
// both architectures below RepositoryDir, byte for byte (SHA-256) those of
// the build's packages directory, readable by the endpoint's user.
func checkPackages(t *testing.T, b built, files map[string]tarFile) {
	t.Helper()
	if b.opts.PackagesDir == "" {
		t.Fatal("the image was built without -packages: it carries no agent packages for the local repository")
	}
	repo := strings.TrimPrefix(RepositoryDir, "/")
	var got []string
	for name, f := range files {
		if strings.HasPrefix(name, repo+"/") && f.Typeflag == tar.TypeReg {
			got = append(got, strings.TrimPrefix(name, repo+"/"))
		}
	}
	slices.Sort(got)
	if want := slices.Sorted(slices.Values(AgentPackages)); !slices.Equal(got, want) {
		t.Errorf("packages in %s: %v, want %v", RepositoryDir, got, want)
	}
	for _, name := range AgentPackages {
		f, ok := files[repo+"/"+name]
		if !ok {
			continue
		}
		want := sha256.Sum256(mustRead(t, filepath.Join(b.opts.PackagesDir, name)))
		if sum := sha256.Sum256(f.data); sum != want {
			t.Errorf("%s: sha256 %x in the image, %x in %s", name, sum, want, b.opts.PackagesDir)
		}
		if f.Mode != 0o644 || f.Uid != 0 {
			t.Errorf("%s: mode %o owner %d, want 644 root (readable by 65532, not writable)", name, f.Mode, f.Uid)
		}
	}
	for dir := repo; dir != "var"; dir = path.Dir(dir) {
		if f, ok := files[dir]; !ok || f.Typeflag != tar.TypeDir || f.Mode != 0o755 {
			t.Errorf("%s: not a 0755 directory in the image", dir)
		}
	}
}

// A packages directory without one of the agent's packages, or with a
// file that is not the package its name says, is refused, naming it.
func TestPackagesRefused(t *testing.T) {
	tests := []struct {
		name    string
		change  func(dir string) error
		wantErr string
	}{
		{name: "an arm64 RPM missing", change: func(dir string) error { return os.Remove(filepath.Join(dir, "rpm/arm64/onboarding-agent.rpm")) },
			wantErr: "package rpm/arm64/onboarding-agent.rpm (make packages writes it)"},
		{name: "an RPM where the DEB belongs", change: func(dir string) error {
			return os.Rename(filepath.Join(dir, "rpm/amd64/onboarding-agent.rpm"), filepath.Join(dir, "deb/amd64/onboarding-agent.deb"))
		}, wantErr: "package deb/amd64/onboarding-agent.deb: " + "%s/deb/amd64/onboarding-agent.deb is not a deb package"},
		{name: "a text file as an RPM", change: func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "rpm/amd64/onboarding-agent.rpm"), []byte("not found\n"), 0o644)
		}, wantErr: "is not a rpm package"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("EMBARK_PACKAGES_DIR", "")
			dir := testPackages(t)
			if err := tc.change(dir); err != nil {
				t.Fatal(err)
			}
			_, err := packagesLayer(Options{PackagesDir: dir, Created: time.Unix(1767225600, 0)})
			want := tc.wantErr
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, dir)
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("packagesLayer: %v, want an error containing %q", err, want)
			}
		})
	}
	if l, err := packagesLayer(Options{}); l != nil || err != nil {
		t.Errorf("no packages directory: layer %v, error %v; want none", l, err)
	}
}

func checkRoots(t *testing.T, bundle []byte) {
	t.Helper()
	n := 0
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("CA bundle: %v", err)
		}
		n++
	}
	// Mozilla's store has about 150 roots; AWS's (Amazon Root CA 1) among them.
	if n < 100 {
		t.Errorf("CA bundle has %d roots, want the Mozilla store's (over 100)", n)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	if !strings.Contains(string(bundle), "-----BEGIN CERTIFICATE-----") {
		t.Errorf("CA bundle is not PEM")
	}
}

// checkBinary checks the entrypoint is a static ELF for arch, built with
// CGO_ENABLED=0 and -trimpath.
func checkBinary(t *testing.T, data []byte, arch string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("entrypoint is not ELF: %v", err)
	}
	wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != wantMachine {
		t.Errorf("ELF machine %s, want %s", f.Machine, wantMachine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary is dynamically linked (%s)", p.Type)
		}
	}
	info, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("build info: %v", err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for k, v := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "GOARCH": arch, "GOOS": "linux"} {
		if settings[k] != v {
			t.Errorf("build setting %s=%q, want %q", k, settings[k], v)
		}
	}
	// -buildvcs=false: no VCS stamp (it would change with a dirty tree).
	for k := range settings {
		if strings.HasPrefix(k, "vcs") {
			t.Errorf("build setting %s=%q: built with VCS stamping", k, settings[k])
		}
	}
}

func checkSBOM(t *testing.T, b built, doc sbom.Document, bin []byte) {
	t.Helper()
	if doc.SPDXVersion != "SPDX-2.3" || doc.SPDXID != "SPDXRef-DOCUMENT" {
		t.Errorf("SBOM is not an SPDX 2.3 document: %s %s", doc.SPDXVersion, doc.SPDXID)
	}
	if doc.CreationInfo.Created != b.opts.Created.Format(time.RFC3339) {
		t.Errorf("SBOM created %s", doc.CreationInfo.Created)
	}
	info, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]sbom.Package{}
	for _, p := range doc.Packages {
		byName[p.Name] = p
	}
	main, ok := byName[info.Main.Path]
	if !ok || main.VersionInfo != b.opts.Version {
		t.Errorf("SBOM main package %q: %+v", info.Main.Path, main)
	}
	if std := byName["stdlib"]; std.VersionInfo != info.GoVersion {
		t.Errorf("SBOM stdlib version %q, want %q", std.VersionInfo, info.GoVersion)
	}
	// Every module compiled in is listed at its version.
	if len(info.Deps) < 10 {
		t.Errorf("binary records only %d modules", len(info.Deps))
	}
	for _, dep := range info.Deps {
		m := dep
		if dep.Replace != nil {
			m = dep.Replace
		}
		if p, ok := byName[m.Path]; !ok || p.VersionInfo != m.Version {
			t.Errorf("SBOM lacks %s %s (has %q)", m.Path, m.Version, p.VersionInfo)
		}
	}
	if len(doc.Relationships) != len(doc.Packages) {
		t.Errorf("%d relationships for %d packages", len(doc.Relationships), len(doc.Packages))
	}
}

type tarFile struct {
	*tar.Header
	data []byte
}

func readFiles(t *testing.T, img v1.Image) map[string]tarFile {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]tarFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		// Directories without their trailing slash.
		files[strings.TrimSuffix(h.Name, "/")] = tarFile{Header: h, data: data}
	}
	return files
}

// unpack writes img's flattened filesystem under dir.
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	for name, f := range readFiles(t, img) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch f.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, f.data, os.FileMode(f.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: unexpected tar entry type %c", name, f.Typeflag)
		}
	}
	// Directory modes last, as MkdirAll made them 0755.
	for name, f := range readFiles(t, img) {
		if f.Typeflag == tar.TypeDir {
			mode := os.FileMode(f.Mode).Perm()
			if f.Mode&0o1000 != 0 {
				mode |= os.ModeSticky
			}
			if err := os.Chmod(filepath.Join(dir, filepath.FromSlash(name)), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
