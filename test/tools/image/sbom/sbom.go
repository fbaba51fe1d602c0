// Package sbom writes an SPDX 2.3 JSON software bill of materials for a Go
// binary from the build information the Go linker records in it (what
// debug/buildinfo reads): the main module, the Go standard library, every
// module compiled in, and the build settings. Nothing is scanned or
// guessed: licenses of dependencies are NOASSERTION.
package sbom

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"time"
)

// Options describe the binary and its release.
type Options struct {
	// Binary is the file to describe (required).
	Binary string
	// Path is where the binary is installed in the image, e.g.
	// /usr/local/bin/onboarding-endpoint (required).
	Path string
	// Version is the release version of the main module (required; Go
	// records "(devel)" for a build from a working tree).
	Version string
	// Revision is the source commit (optional).
	Revision string
	// Source is the repository URL (required).
	Source string
	// License is the main module's SPDX license expression (default
	// NOASSERTION).
	License string
	// Created is the document's creation time (SOURCE_DATE_EPOCH, so that
	// the same inputs give the same bytes).
	Created time.Time
	// Platform is "linux/amd64" or similar, part of the document name.
	Platform string
}

// Document is the subset of SPDX 2.3 JSON this package writes.
type Document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      CreationInfo   `json:"creationInfo"`
	Packages          []Package      `json:"packages"`
	Relationships     []Relationship `json:"relationships"`
}

// CreationInfo says when and by what the document was made.
type CreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

// Package is one SPDX package: the binary's main module, the standard
// library or a dependency.
type Package struct {
	SPDXID           string        `json:"SPDXID"`
	Name             string        `json:"name"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	PackageFileName  string        `json:"packageFileName,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	Checksums        []Checksum    `json:"checksums,omitempty"`
	LicenseConcluded string        `json:"licenseConcluded"`
	LicenseDeclared  string        `json:"licenseDeclared"`
	CopyrightText    string        `json:"copyrightText"`
	Comment          string        `json:"comment,omitempty"`
	ExternalRefs     []ExternalRef `json:"externalRefs,omitempty"`
}

// Checksum is a file digest.
type Checksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

// ExternalRef is a package URL.
type ExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

// Relationship links two SPDX elements.
type Relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// Generate reads opts.Binary's Go build information and returns its SPDX
// document.
func Generate(opts Options) (*Document, error) {
	if opts.Binary == "" || opts.Path == "" || opts.Version == "" || opts.Source == "" {
		return nil, fmt.Errorf("sbom: binary, path, version and source are required")
	}
	if opts.License == "" {
		opts.License = "NOASSERTION"
	}
	data, err := os.ReadFile(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	info, err := buildinfo.ReadFile(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("read Go build info of %s: %w", opts.Binary, err)
	}
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	name := info.Path[strings.LastIndex(info.Path, "/")+1:]

	doc := &Document{
		SPDXVersion: "SPDX-2.3",
		DataLicense: "CC0-1.0",
		SPDXID:      "SPDXRef-DOCUMENT",
		Name:        fmt.Sprintf("%s %s %s", name, opts.Version, opts.Platform),
		// Unique per binary, and the same for the same binary.
		DocumentNamespace: fmt.Sprintf("%s/spdx/%s-%s-%s", strings.TrimSuffix(opts.Source, "/"), name, opts.Version, digest),
		CreationInfo: CreationInfo{
			Created:  opts.Created.UTC().Format(time.RFC3339),
			Creators: []string{"Tool: embark-image-sbom", "Tool: " + info.GoVersion + " debug/buildinfo"},
		},
	}

	main := Package{
		SPDXID:           "SPDXRef-Package-main",
		Name:             info.Main.Path,
		VersionInfo:      opts.Version,
		PackageFileName:  opts.Path,
		DownloadLocation: downloadLocation(opts.Source, opts.Revision),
		Checksums:        []Checksum{{Algorithm: "SHA256", ChecksumValue: digest}},
		LicenseConcluded: opts.License,
		LicenseDeclared:  opts.License,
		CopyrightText:    "NOASSERTION",
		Comment:          fmt.Sprintf("Go binary %s (package %s); build settings: %s", opts.Path, info.Path, settings(info.Settings)),
		ExternalRefs:     []ExternalRef{purl(info.Main.Path, opts.Version)},
	}
	stdlib := Package{
		SPDXID:           "SPDXRef-Package-stdlib",
		Name:             "stdlib",
		VersionInfo:      info.GoVersion,
		DownloadLocation: "https://go.dev/dl/",
		LicenseConcluded: "NOASSERTION",
		LicenseDeclared:  "BSD-3-Clause",
		CopyrightText:    "NOASSERTION",
		Comment:          "The Go standard library and runtime linked into the binary.",
		ExternalRefs:     []ExternalRef{purl("stdlib", info.GoVersion)},
	}
	doc.Packages = append(doc.Packages, main, stdlib)
	doc.Relationships = append(doc.Relationships,
		Relationship{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: main.SPDXID},
		Relationship{Element: main.SPDXID, Type: "DEPENDS_ON", Related: stdlib.SPDXID})

	deps := append([]*debug.Module(nil), info.Deps...)
	sort.Slice(deps, func(i, j int) bool { return deps[i].Path < deps[j].Path })
	for i, dep := range deps {
		m := dep
		comment := ""
		if dep.Replace != nil {
			m = dep.Replace
			comment = fmt.Sprintf("replaces %s %s", dep.Path, dep.Version)
		}
		if m.Sum != "" {
			comment = strings.TrimSpace(comment + " go.sum " + m.Sum)
		}
		p := Package{
			SPDXID:           fmt.Sprintf("SPDXRef-Package-dep-%d", i+1),
			Name:             m.Path,
			VersionInfo:      m.Version,
			DownloadLocation: "NOASSERTION",
			LicenseConcluded: "NOASSERTION",
			LicenseDeclared:  "NOASSERTION",
			CopyrightText:    "NOASSERTION",
			Comment:          comment,
			ExternalRefs:     []ExternalRef{purl(m.Path, m.Version)},
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, Relationship{Element: main.SPDXID, Type: "DEPENDS_ON", Related: p.SPDXID})
	}
	return doc, nil
}

// ContainedIn makes the document describe file, a release artifact that
// ships the binary (a DEB or RPM package): file becomes a package of the
// document that CONTAINS the binary's main package, the document DESCRIBES
// file instead of the binary, and the document's name and namespace become
// file's so that each artifact has its own document.
func (d *Document) ContainedIn(file Package) {
	file.SPDXID = "SPDXRef-Package-artifact"
	for i, r := range d.Relationships {
		if r.Element == "SPDXRef-DOCUMENT" && r.Type == "DESCRIBES" {
			d.Relationships[i].Related = file.SPDXID
		}
	}
	d.Relationships = append(d.Relationships, Relationship{Element: file.SPDXID, Type: "CONTAINS", Related: "SPDXRef-Package-main"})
	d.Packages = append([]Package{file}, d.Packages...)
	d.Name = file.Name + " " + file.VersionInfo + " " + file.PackageFileName
	d.DocumentNamespace = namespaceFor(d.DocumentNamespace, file)
}

// namespaceFor is the namespace of a document describing file: the
// binary's namespace with the file's name and digest in place of the
// binary's, so it is unique per file and the same for the same file.
func namespaceFor(binaryNamespace string, file Package) string {
	base := binaryNamespace[:strings.LastIndex(binaryNamespace, "/")+1]
	digest := ""
	for _, c := range file.Checksums {
		if c.Algorithm == "SHA256" {
			digest = c.ChecksumValue
		}
	}
	return base + file.PackageFileName + "-" + digest
}

// Marshal is the document as indented JSON with a final newline.
func (d *Document) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal SPDX document: %w", err)
	}
	return append(b, '\n'), nil
}

func purl(path, version string) ExternalRef {
	loc := "pkg:golang/" + path
	if version != "" {
		loc += "@" + version
	}
	return ExternalRef{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: loc}
}

func downloadLocation(source, revision string) string {
	if revision == "" {
		return "git+" + source
	}
	return "git+" + source + "@" + revision
}

func settings(s []debug.BuildSetting) string {
	parts := make([]string, 0, len(s))
	for _, kv := range s {
		parts = append(parts, kv.Key+"="+kv.Value)
	}
	return strings.Join(parts, " ")
}
