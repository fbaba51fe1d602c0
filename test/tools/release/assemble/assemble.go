// Package assemble writes one release directory from what the build
// already made: the Helm chart packaged with Helm's Go SDK, the image
// archive and SBOMs `make image` wrote, the agent's DEB and RPM packages
// `make packages` wrote with an SPDX SBOM each and the public key of their
// OpenPGP signatures (repository.asc), an SPDX SBOM for the chart,
// SHA256SUMS, and a cosign-format signature (<file>.sig) for every file and
// for SHA256SUMS, with the public key as cosign.pub. Nothing is rebuilt.
package assemble

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"

	"github.com/embark-mesh/embark/test/tools/image/sbom"
	"github.com/embark-mesh/embark/test/tools/release/sign"
)

// Names of files in a release directory.
const (
	SumsFile      = "SHA256SUMS"
	PublicKeyFile = "cosign.pub"
	SigSuffix     = ".sig"
	SBOMSuffix    = ".spdx.json"
	imageArchive  = "onboarding-endpoint.oci.tar"
)

// Options say where the build's outputs are and what release they are.
type Options struct {
	// Version is the release version, e.g. v0.2.0 (required): the chart's
	// appVersion, the image's and the agent binaries' stamped version must
	// be this one.
	Version string
	// Revision is the source commit (optional).
	Revision string
	// Source is the repository URL.
	Source string
	// ChartDir is the Helm chart's directory.
	ChartDir string
	// ImageDir is `make image`'s output: onboarding-endpoint.oci.tar,
	// digest, build.json and sbom/*.spdx.json.
	ImageDir string
	// ImageName is the image's repository name, e.g.
	// embark-mesh/onboarding-endpoint.
	ImageName string
	// PackagesDir is `make packages`' output: {deb,rpm}/<arch>/onboarding-agent.{deb,rpm}.
	PackagesDir string
	// PackagesSigningKey is the armored OpenPGP private key the packages
	// were signed with; its public key is published as repository.asc.
	PackagesSigningKey string
	// BinDir holds linux_<arch>/onboarding-agent, the binaries the packages
	// ship (`make packages` builds them there).
	BinDir string
	// Arches are the packages' architectures, e.g. amd64 and arm64.
	Arches []string
	// Created is every SBOM's creation time (SOURCE_DATE_EPOCH).
	Created time.Time
	// Signer signs every file.
	Signer *sign.Signer
}

// Assemble writes the release into out, replacing what was there, and
// returns the names of the files it signed. It writes into out+".partial"
// and renames that to out once every file is signed, so that out is never
// a half-written release.
func Assemble(opts Options, out string) ([]string, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	partial := out + ".partial"
	if err := os.RemoveAll(partial); err != nil {
		return nil, fmt.Errorf("empty %s: %w", partial, err)
	}
	if err := os.MkdirAll(partial, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", partial, err)
	}
	signed, err := writeRelease(opts, partial)
	if err != nil {
		os.RemoveAll(partial)
		return nil, err
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, fmt.Errorf("replace %s: %w", out, err)
	}
	if err := os.Rename(partial, out); err != nil {
		return nil, fmt.Errorf("move the release into place: %w", err)
	}
	return signed, nil
}

// writeRelease writes every file of the release into the empty directory out.
func writeRelease(opts Options, out string) ([]string, error) {
	imageDigest, err := copyImage(opts, out)
	if err != nil {
		return nil, err
	}
	if err := packageChart(opts, out, imageDigest); err != nil {
		return nil, err
	}
	if err := copyPackages(opts, out); err != nil {
		return nil, err
	}
	if err := writeRepositoryKey(opts.PackagesSigningKey, out); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, PublicKeyFile), opts.Signer.PublicKeyPEM(), 0o644); err != nil {
		return nil, fmt.Errorf("write public key: %w", err)
	}
	return signAll(opts.Signer, out)
}

func (o Options) check() error {
	switch {
	case o.Version == "":
		return fmt.Errorf("release version is required")
	case o.Signer == nil:
		return fmt.Errorf("a signing key is required")
	case len(o.Arches) == 0:
		return fmt.Errorf("package architectures are required")
	case o.PackagesSigningKey == "":
		return fmt.Errorf("the packages' signing key is required")
	}
	return nil
}

// packageVersion is the DEB/RPM and chart version: the release version
// without its leading v.
func (o Options) packageVersion() string { return strings.TrimPrefix(o.Version, "v") }

// copyImage copies the image archive, its digest and its SBOMs after checking the
// image is of this release; it returns the image index's digest.
func copyImage(opts Options, out string) (string, error) {
	var built struct {
		Version string `json:"version"`
	}
	raw, err := os.ReadFile(filepath.Join(opts.ImageDir, "build.json"))
	if err != nil {
		return "", fmt.Errorf("image (run make image first): %w", err)
	}
	if err := json.Unmarshal(raw, &built); err != nil {
		return "", fmt.Errorf("image build.json: %w", err)
	}
	if built.Version != opts.Version {
		return "", fmt.Errorf("image in %s is version %q, want %q: run make image", opts.ImageDir, built.Version, opts.Version)
	}
	digest, err := os.ReadFile(filepath.Join(opts.ImageDir, "digest"))
	if err != nil {
		return "", fmt.Errorf("image digest: %w", err)
	}
	name := fmt.Sprintf("onboarding-endpoint_%s.oci.tar", opts.Version)
	if err := copyFile(filepath.Join(opts.ImageDir, imageArchive), filepath.Join(out, name)); err != nil {
		return "", err
	}
	// The digest a registry reports for the pushed image (crane digest).
	if err := copyFile(filepath.Join(opts.ImageDir, "digest"), filepath.Join(out, fmt.Sprintf("onboarding-endpoint_%s.digest", opts.Version))); err != nil {
		return "", err
	}
	sboms, err := filepath.Glob(filepath.Join(opts.ImageDir, "sbom", "*"+SBOMSuffix))
	if err != nil || len(sboms) == 0 {
		return "", fmt.Errorf("no image SBOM in %s/sbom", opts.ImageDir)
	}
	for _, s := range sboms {
		if err := copyFile(s, filepath.Join(out, filepath.Base(s))); err != nil {
			return "", err
		}
	}
	return strings.TrimSpace(string(digest)), nil
}

// packageChart packages the chart as `helm package` does and writes its
// SBOM: the chart, which deploys the image.
func packageChart(opts Options, out, imageDigest string) error {
	ch, err := loader.LoadDir(opts.ChartDir)
	if err != nil {
		return fmt.Errorf("load chart: %w", err)
	}
	if ch.Metadata.AppVersion != opts.Version || ch.Metadata.Version != opts.packageVersion() {
		return fmt.Errorf("chart is version %s (appVersion %s), want %s: run make set-version", ch.Metadata.Version, ch.Metadata.AppVersion, opts.Version)
	}
	path, err := chartutil.Save(ch, out)
	if err != nil {
		return fmt.Errorf("package chart: %w", err)
	}
	digest, err := fileSHA256(path)
	if err != nil {
		return err
	}
	doc := chartSBOM(opts, ch.Metadata.Name, filepath.Base(path), digest, imageDigest)
	return writeSBOM(doc, path+SBOMSuffix)
}

// chartSBOM describes the chart package, which DEPENDS_ON the image it
// deploys (by digest).
func chartSBOM(opts Options, name, file, digest, imageDigest string) *sbom.Document {
	chart := sbom.Package{
		SPDXID: "SPDXRef-Package-chart", Name: name, VersionInfo: opts.packageVersion(), PackageFileName: file,
		DownloadLocation: downloadLocation(opts), FilesAnalyzed: false,
		Checksums:        []sbom.Checksum{{Algorithm: "SHA256", ChecksumValue: digest}},
		LicenseConcluded: "Apache-2.0", LicenseDeclared: "Apache-2.0", CopyrightText: "NOASSERTION",
		Comment:      "Helm chart of Embark's onboarding endpoint",
		ExternalRefs: []sbom.ExternalRef{{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: fmt.Sprintf("pkg:helm/%s@%s", name, opts.packageVersion())}},
	}
	repo := opts.ImageName[strings.LastIndex(opts.ImageName, "/")+1:]
	image := sbom.Package{
		SPDXID: "SPDXRef-Package-image", Name: opts.ImageName, VersionInfo: opts.Version,
		DownloadLocation: "NOASSERTION", LicenseConcluded: "NOASSERTION", LicenseDeclared: "Apache-2.0", CopyrightText: "NOASSERTION",
		Checksums:    []sbom.Checksum{{Algorithm: "SHA256", ChecksumValue: strings.TrimPrefix(imageDigest, "sha256:")}},
		Comment:      "the onboarding-endpoint image the chart deploys; its own SBOMs are onboarding-endpoint_<platform>.spdx.json",
		ExternalRefs: []sbom.ExternalRef{{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: fmt.Sprintf("pkg:oci/%s@%s?repository_url=%s&tag=%s", repo, strings.ReplaceAll(imageDigest, ":", "%3A"), opts.ImageName, opts.Version)}},
	}
	return &sbom.Document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              fmt.Sprintf("%s %s %s", name, opts.packageVersion(), file),
		DocumentNamespace: fmt.Sprintf("%s/spdx/%s-%s", strings.TrimSuffix(opts.Source, "/"), file, digest),
		CreationInfo:      sbom.CreationInfo{Created: opts.Created.UTC().Format(time.RFC3339), Creators: []string{"Tool: embark-release"}},
		Packages:          []sbom.Package{chart, image},
		Relationships: []sbom.Relationship{
			{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: chart.SPDXID},
			{Element: chart.SPDXID, Type: "DEPENDS_ON", Related: image.SPDXID},
		},
	}
}

// copyPackages copies each DEB and RPM under a name that says its version
// and architecture, and writes its SBOM: the package CONTAINS the agent
// binary, described from its Go build information.
func copyPackages(opts Options, out string) error {
	for _, arch := range opts.Arches {
		bin := filepath.Join(opts.BinDir, "linux_"+arch, "onboarding-agent")
		for _, format := range []string{"deb", "rpm"} {
			src := filepath.Join(opts.PackagesDir, format, arch, "onboarding-agent."+format)
			name := fmt.Sprintf("onboarding-agent_%s_linux_%s.%s", opts.packageVersion(), arch, format)
			if err := copyFile(src, filepath.Join(out, name)); err != nil {
				return fmt.Errorf("package (run make packages first): %w", err)
			}
			if err := packageSBOM(opts, bin, arch, filepath.Join(out, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func packageSBOM(opts Options, bin, arch, pkg string) error {
	doc, err := sbom.Generate(sbom.Options{Binary: bin, Path: "/usr/bin/onboarding-agent", Version: opts.Version,
		Revision: opts.Revision, Source: opts.Source, License: "Apache-2.0", Created: opts.Created, Platform: "linux/" + arch})
	if err != nil {
		return fmt.Errorf("SBOM of %s: %w", bin, err)
	}
	digest, err := fileSHA256(pkg)
	if err != nil {
		return err
	}
	doc.ContainedIn(sbom.Package{
		Name: "onboarding-agent", VersionInfo: opts.packageVersion(), PackageFileName: filepath.Base(pkg),
		DownloadLocation: downloadLocation(opts), Checksums: []sbom.Checksum{{Algorithm: "SHA256", ChecksumValue: digest}},
		LicenseConcluded: "Apache-2.0", LicenseDeclared: "Apache-2.0", CopyrightText: "NOASSERTION",
		Comment: "the onboarding-agent " + strings.ToUpper(filepath.Ext(pkg)[1:]) + " package for linux/" + arch + "; it installs /usr/bin/onboarding-agent",
	})
	return writeSBOM(doc, pkg+SBOMSuffix)
}

func downloadLocation(opts Options) string {
	if opts.Revision == "" {
		return "git+" + opts.Source
	}
	return "git+" + opts.Source + "@" + opts.Revision
}

func writeSBOM(doc *sbom.Document, path string) error {
	b, err := doc.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write SBOM: %w", err)
	}
	return nil
}

// signAll writes SHA256SUMS over every file but the signatures, then signs
// every file it lists but the public key, and SHA256SUMS itself.
func signAll(s *sign.Signer, out string) ([]string, error) {
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", out, err)
	}
	var sums strings.Builder
	var signed []string
	for _, e := range entries {
		name := e.Name()
		sum, err := fileSHA256(filepath.Join(out, name))
		if err != nil {
			return nil, err
		}
		// Two spaces: the text-mode line `sha256sum -c` reads.
		fmt.Fprintf(&sums, "%s  %s\n", sum, name)
		if name != PublicKeyFile {
			signed = append(signed, name)
		}
	}
	if err := os.WriteFile(filepath.Join(out, SumsFile), []byte(sums.String()), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", SumsFile, err)
	}
	signed = append(signed, SumsFile)
	sort.Strings(signed)
	for _, name := range signed {
		if err := s.SignFile(filepath.Join(out, name)); err != nil {
			return nil, err
		}
	}
	return signed, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("checksum: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checksum %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}
