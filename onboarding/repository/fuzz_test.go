package repository

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParsePath: an accepted path names a local file of the repository
// (never outside it), and the URL path is exactly /install/<file>[.sha256].
func FuzzParsePath(f *testing.F) {
	for _, p := range seedPaths {
		f.Add(p)
		f.Add(p + ChecksumSuffix)
	}
	for _, p := range []string{"/install/dists/stable/InRelease", "/install/dists/revision-canary/main/binary-arm64/Packages.gz",
		"/install/dists/stable/main/binary-amd64/by-hash/SHA256/" + strings.Repeat("ab", 32), "/install/rpm/repodata/repomd.xml.asc",
		"/install/istio-sidecar/canary/rpm/repodata/" + strings.Repeat("0", 64) + "-primary.xml.gz", "/install/repository.asc",
		"/install/dists/../rpm/repodata/repomd.xml", "/install/dists/stable/../../deb/amd64/onboarding-agent.deb",
		"/install/deb/amd64/../../x.deb", "/install/istio-sidecar/../../deb/amd64/istio-sidecar.deb", "/install//deb/amd64/onboarding-agent.deb", "/install/deb/amd64/onboarding-agent.deb.sha256.sha256"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, urlPath string) {
		p, err := ParsePath(urlPath)
		if err != nil {
			return
		}
		if !filepath.IsLocal(p.File) || strings.Contains(p.File, "..") || strings.Contains(p.File, "\\") || strings.Contains(p.File, "//") {
			t.Fatalf("%q parsed to a non-local file %q", urlPath, p.File)
		}
		want := Prefix + p.File
		if p.Generated {
			if p.Checksum || want != urlPath || strings.HasSuffix(p.File, ".deb") || strings.HasSuffix(p.File, ".rpm") {
				t.Fatalf("%q parsed to %+v", urlPath, p)
			}
			return
		}
		if p.Checksum {
			want += ChecksumSuffix
		}
		if want != urlPath {
			t.Fatalf("%q parsed to %+v", urlPath, p)
		}
		if !strings.HasSuffix(p.File, ".deb") && !strings.HasSuffix(p.File, ".rpm") {
			t.Fatalf("%q parsed to a file that is no package: %q", urlPath, p.File)
		}
	})
}
