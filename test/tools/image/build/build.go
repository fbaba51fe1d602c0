// Package build assembles Embark's onboarding-endpoint container image
// without a container daemon or a registry: it cross-compiles static Go
// binaries, lays out a minimal base (passwd and group with the non-root user
// 65532, CA roots from Go's x509roots/fallback module, an empty /tmp), adds
// an SPDX SBOM made from each binary's Go build info, adds the
// onboarding-agent DEB and RPM packages of both architectures at the local
// repository's default directory, and writes a multi-platform OCI image index as an OCI layout directory and an OCI
// archive (a tar of that directory). The same Options give the same bytes:
// every timestamp is Options.Created and every tar is sorted.
package build

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"

	"github.com/embark-mesh/embark/test/tools/image/sbom"
)

// The image's fixed facts.
const (
	// User is the numeric user and group the entrypoint runs as.
	User = "65532:65532"
	// BinDir holds the entrypoint binary.
	BinDir = "/usr/local/bin"
	// CABundle is where Go's crypto/x509 looks first on Linux.
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	// SBOMDir holds the SPDX document of the binary inside the image.
	SBOMDir = "/usr/share/doc/embark"
	// RepositoryDir holds the agent's packages in the layout of the local
	// repository's URL tree: the default of the endpoint's
	// localRepository.directory and of the chart's, so an endpoint with
	// the repository on serves them as they are.
	RepositoryDir = "/var/lib/onboarding-endpoint/repository"
)

// AgentPackages are the package files the image carries below
// RepositoryDir (and reads below Options.PackagesDir): the agent for both
// architectures, whatever the image's own platform, as VMs of either may
// install from any endpoint.
var AgentPackages = []string{
	"deb/amd64/onboarding-agent.deb",
	"deb/arm64/onboarding-agent.deb",
	"rpm/amd64/onboarding-agent.rpm",
	"rpm/arm64/onboarding-agent.rpm",
}

// Options are the inputs of one image build; the same Options (and the same
// sources, Go toolchain and module versions) give the same image digest.
type Options struct {
	// ModuleDir is the Go module to build from (required).
	ModuleDir string `json:"moduleDir"`
	// Package is the main package to build, e.g. ./cmd/onboarding-endpoint
	// (required). The binary is named after its last element.
	Package string `json:"package"`
	// Platforms are os/arch pairs (default linux/amd64 and linux/arm64).
	Platforms []string `json:"platforms"`
	// LDFlags are added to "-s -w" (the version stamps).
	LDFlags string `json:"ldflags"`
	// Name is the image's repository name, e.g.
	// embark-mesh/onboarding-endpoint (required).
	Name string `json:"name"`
	// Version is the release version and the tag in the layout (required).
	Version string `json:"version"`
	// Revision is the source commit (required).
	Revision string `json:"revision"`
	// Source is the source repository URL (required).
	Source string `json:"source"`
	// Licenses is an SPDX license expression (default Apache-2.0).
	Licenses string `json:"licenses"`
	// LicenseFile, when set, is copied into the image beside the SBOM.
	LicenseFile string `json:"licenseFile,omitempty"`
	// PackagesDir is `make packages`' output directory: each of
	// AgentPackages below it is copied to RepositoryDir in every platform
	// image (all of them are required). Empty: the image carries no
	// packages.
	PackagesDir string `json:"packagesDir,omitempty"`
	// Created is every timestamp in the image (SOURCE_DATE_EPOCH, required).
	Created time.Time `json:"created"`
	// Env is added to go build's environment, e.g. GOCACHE=<empty dir>
	// to compile every package afresh. Not an input of the image: the
	// same Options with any Env must give the same digest.
	Env []string `json:"-"`
}

func (o *Options) setDefaults() error {
	if len(o.Platforms) == 0 {
		o.Platforms = []string{"linux/amd64", "linux/arm64"}
	}
	if o.Licenses == "" {
		o.Licenses = "Apache-2.0"
	}
	for name, v := range map[string]string{"module dir": o.ModuleDir, "package": o.Package, "name": o.Name, "version": o.Version, "revision": o.Revision, "source": o.Source} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if o.Created.IsZero() {
		return fmt.Errorf("created (SOURCE_DATE_EPOCH) is required")
	}
	o.Created = o.Created.UTC()
	return nil
}

// Binary is the name of the entrypoint binary.
func (o Options) Binary() string { return path.Base(o.Package) }

// Entrypoint is the entrypoint's path in the image.
func (o Options) Entrypoint() string { return path.Join(BinDir, o.Binary()) }

// Result says what was built.
type Result struct {
	// Digest is the OCI image index's digest: the image's identity.
	Digest v1.Hash
	// Index is the multi-platform image index.
	Index v1.ImageIndex
	// Images are the per-platform images, in Options.Platforms order.
	Images []PlatformImage
	// Layout is the OCI layout directory; Archive the tar of it.
	Layout, Archive string
}

// PlatformImage is one platform's image.
type PlatformImage struct {
	Platform v1.Platform
	Digest   v1.Hash
	// Size is the bytes a registry stores for it: manifest, config and
	// compressed layers.
	Size int64
	// Binary and SBOM are the files built for it, outside the image.
	Binary, SBOM string
}

// Paths under an output directory.
const (
	LayoutDir   = "layout"
	ArchiveName = "onboarding-endpoint.oci.tar"
	DigestFile  = "digest"
	InputsFile  = "build.json"
)

// Build builds the image described by opts into out: bin/<os>_<arch>/ (the
// binaries), sbom/ (one SPDX JSON per platform, also inside each image),
// layout/ (the OCI layout, index.json naming the image index by Version),
// onboarding-endpoint.oci.tar (the same as an OCI archive), digest and
// build.json (the inputs, to rebuild and compare).
func Build(ctx context.Context, opts Options, out string) (*Result, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("image options: %w", err)
	}
	base, err := baseLayer(opts)
	if err != nil {
		return nil, err
	}
	pkgs, err := packagesLayer(opts)
	if err != nil {
		return nil, err
	}
	anns := annotations(opts)
	res := &Result{Layout: filepath.Join(out, LayoutDir), Archive: filepath.Join(out, ArchiveName)}
	var adds []mutate.IndexAddendum
	for _, p := range opts.Platforms {
		plat, err := parsePlatform(p)
		if err != nil {
			return nil, err
		}
		pi, img, err := platformImage(ctx, opts, plat, []v1.Layer{base, pkgs}, anns, out)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		res.Images = append(res.Images, *pi)
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &pi.Platform}})
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.AppendManifests(idx, adds...)
	idx = mutate.Annotations(idx, anns).(v1.ImageIndex)
	res.Index = idx
	if res.Digest, err = idx.Digest(); err != nil {
		return nil, fmt.Errorf("index digest: %w", err)
	}

	if err := os.RemoveAll(res.Layout); err != nil {
		return nil, fmt.Errorf("remove old layout: %w", err)
	}
	lp, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("write OCI layout: %w", err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": opts.Version,
		"io.containerd.image.name":          opts.Name + ":" + opts.Version,
	})); err != nil {
		return nil, fmt.Errorf("write image index to OCI layout: %w", err)
	}
	if err := tarDir(res.Layout, res.Archive, opts.Created); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, DigestFile), []byte(res.Digest.String()+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("write digest: %w", err)
	}
	inputs, err := json.MarshalIndent(opts, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal inputs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, InputsFile), append(inputs, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("write inputs: %w", err)
	}
	return res, nil
}

// platformImage compiles the binary for plat, writes its SBOM and returns
// its image: the shared layers (base; the packages, when not nil), then
// the binary, SBOM and license.
func platformImage(ctx context.Context, opts Options, plat v1.Platform, shared []v1.Layer, anns map[string]string, out string) (*PlatformImage, v1.Image, error) {
	pi := &PlatformImage{Platform: plat}
	dir := plat.OS + "_" + plat.Architecture
	pi.Binary = filepath.Join(out, "bin", dir, opts.Binary())
	if err := compile(ctx, opts, plat, pi.Binary); err != nil {
		return nil, nil, err
	}
	doc, err := sbom.Generate(sbom.Options{
		Binary: pi.Binary, Path: opts.Entrypoint(), Version: opts.Version, Revision: opts.Revision,
		Source: opts.Source, License: opts.Licenses, Created: opts.Created, Platform: plat.OS + "/" + plat.Architecture,
	})
	if err != nil {
		return nil, nil, err
	}
	sbomJSON, err := doc.Marshal()
	if err != nil {
		return nil, nil, err
	}
	pi.SBOM = filepath.Join(out, "sbom", opts.Binary()+"_"+dir+".spdx.json")
	if err := os.MkdirAll(filepath.Dir(pi.SBOM), 0o755); err != nil {
		return nil, nil, fmt.Errorf("sbom dir: %w", err)
	}
	if err := os.WriteFile(pi.SBOM, sbomJSON, 0o644); err != nil {
		return nil, nil, fmt.Errorf("write SBOM: %w", err)
	}

	bin, err := os.ReadFile(pi.Binary)
	if err != nil {
		return nil, nil, fmt.Errorf("read binary: %w", err)
	}
	files := []file{
		{name: opts.Entrypoint(), mode: 0o755, data: bin},
		{name: path.Join(SBOMDir, opts.Binary()+".spdx.json"), mode: 0o644, data: sbomJSON},
	}
	if opts.LicenseFile != "" {
		lic, err := os.ReadFile(opts.LicenseFile)
		if err != nil {
			return nil, nil, fmt.Errorf("read license: %w", err)
		}
		files = append(files, file{name: path.Join(SBOMDir, "LICENSE"), mode: 0o644, data: lic})
	}
	app, err := layer(files, opts.Created)
	if err != nil {
		return nil, nil, fmt.Errorf("application layer: %w", err)
	}

	labels := map[string]string{}
	for k, v := range anns {
		labels[k] = v
	}
	cfg := &v1.ConfigFile{
		Architecture: plat.Architecture,
		OS:           plat.OS,
		Variant:      plat.Variant,
		Created:      v1.Time{Time: opts.Created},
		Config: v1.Config{
			User:       User,
			Entrypoint: []string{opts.Entrypoint()},
			WorkingDir: "/",
			Env:        []string{"PATH=" + BinDir},
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, nil, fmt.Errorf("image config: %w", err)
	}
	adds := []mutate.Addendum{{Layer: shared[0], MediaType: types.OCILayer, History: v1.History{
		Created: v1.Time{Time: opts.Created}, CreatedBy: "embark base: passwd, group, CA roots, /tmp",
	}}}
	if shared[1] != nil {
		adds = append(adds, mutate.Addendum{Layer: shared[1], MediaType: types.OCILayer, History: v1.History{
			Created: v1.Time{Time: opts.Created}, CreatedBy: "embark onboarding-agent packages (deb, rpm; amd64, arm64) in " + RepositoryDir,
		}})
	}
	adds = append(adds, mutate.Addendum{Layer: app, MediaType: types.OCILayer, History: v1.History{
		Created: v1.Time{Time: opts.Created}, CreatedBy: "embark " + opts.Binary() + " " + opts.Version + ", SBOM",
	}})
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, nil, fmt.Errorf("append layers: %w", err)
	}
	img = mutate.Annotations(img, anns).(v1.Image)
	if pi.Digest, err = img.Digest(); err != nil {
		return nil, nil, fmt.Errorf("image digest: %w", err)
	}
	if pi.Size, err = storedSize(img); err != nil {
		return nil, nil, err
	}
	return pi, img, nil
}

// compile builds a static binary: no cgo, no local paths, no VCS stamp (the
// revision is stamped by LDFlags instead, so a dirty tree check or a
// different clone does not change the bytes).
func compile(ctx context.Context, opts Options, plat v1.Platform, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", strings.TrimSpace("-s -w "+opts.LDFlags), "-o", out, opts.Package)
	cmd.Dir = opts.ModuleDir
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED=0", "GOOS="+plat.OS, "GOARCH="+plat.Architecture,
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly")
	cmd.Env = append(cmd.Env, opts.Env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w: %s", opts.Package, plat.OS, plat.Architecture, err, stderr.String())
	}
	return nil
}

// baseLayer is what every platform shares: the users, the CA roots, /tmp.
func baseLayer(opts Options) (v1.Layer, error) {
	roots, err := caBundle()
	if err != nil {
		return nil, err
	}
	files := []file{
		{name: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: CABundle, mode: 0o644, data: roots},
		{name: "/home/nonroot", dir: true, mode: 0o700, uid: 65532},
		{name: "/tmp", dir: true, mode: 0o1777},
	}
	l, err := layer(files, opts.Created)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	return l, nil
}

// packagesLayer is the agent's packages (AgentPackages of
// opts.PackagesDir) below RepositoryDir, readable by every user; nil when
// opts.PackagesDir is empty. A missing file, or one that is not a DEB (an
// ar archive) or an RPM (an RPM lead) as its name says, is an error
// naming it.
func packagesLayer(opts Options) (v1.Layer, error) {
	if opts.PackagesDir == "" {
		return nil, nil
	}
	files, err := packageFiles(opts.PackagesDir)
	if err != nil {
		return nil, err
	}
	l, err := layer(files, opts.Created)
	if err != nil {
		return nil, fmt.Errorf("packages layer: %w", err)
	}
	return l, nil
}

// packageFiles reads AgentPackages below dir as image files below
// RepositoryDir.
func packageFiles(dir string) ([]file, error) {
	var files []file
	for _, name := range AgentPackages {
		src := filepath.Join(dir, filepath.FromSlash(name))
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("package %s (make packages writes it): %w", name, err)
		}
		magic := map[string][]byte{".deb": []byte("!<arch>\n"), ".rpm": {0xed, 0xab, 0xee, 0xdb}}[path.Ext(name)]
		if !bytes.HasPrefix(data, magic) {
			return nil, fmt.Errorf("package %s: %s is not a %s package", name, src, strings.TrimPrefix(path.Ext(name), "."))
		}
		files = append(files, file{name: path.Join(RepositoryDir, name), mode: 0o644, data: data})
	}
	return files, nil
}

// caBundle is a PEM file of the Mozilla root store that the
// golang.org/x/crypto/x509roots/fallback module carries. Roots that the
// module trusts only with a constraint (distrusted after a date) cannot be
// said in a PEM file and are left out.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, fmt.Errorf("encode CA root: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("no CA roots in golang.org/x/crypto/x509roots/fallback")
	}
	return buf.Bytes(), nil
}

func annotations(opts Options) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       opts.Binary(),
		"org.opencontainers.image.description": "Embark's onboarding endpoint: onboards VMs into an Istio mesh beside istiod.",
		"org.opencontainers.image.source":      opts.Source,
		"org.opencontainers.image.url":         opts.Source,
		"org.opencontainers.image.revision":    opts.Revision,
		"org.opencontainers.image.version":     opts.Version,
		"org.opencontainers.image.licenses":    opts.Licenses,
		"org.opencontainers.image.created":     opts.Created.Format(time.RFC3339),
		"org.opencontainers.image.vendor":      "Embark",
	}
}

func parsePlatform(s string) (v1.Platform, error) {
	goos, arch, ok := strings.Cut(s, "/")
	if !ok || goos != "linux" || (arch != "amd64" && arch != "arm64") {
		return v1.Platform{}, fmt.Errorf("platform %q: want linux/amd64 or linux/arm64", s)
	}
	p := v1.Platform{OS: goos, Architecture: arch}
	if arch == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}

func storedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, fmt.Errorf("manifest: %w", err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, fmt.Errorf("raw manifest: %w", err)
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}

// layer is an OCI layer (gzip) of files, with their parent directories.
func layer(files []file, created time.Time) (v1.Layer, error) {
	data, err := tarFiles(files, created)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return l, nil
}
