package sbom

import (
	"os"
	"testing"
	"time"
)

// TestContainedIn describes the test binary, then the file that ships it:
// the document DESCRIBES the file, the file CONTAINS the binary, and the
// name and namespace are the file's.
func TestContainedIn(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := Generate(Options{Binary: exe, Path: "/usr/bin/onboarding-agent", Version: "v1.2.3",
		Source: "https://github.com/embark-mesh/embark", Created: time.Unix(0, 0), Platform: "linux/amd64"})
	if err != nil {
		t.Fatal(err)
	}
	binaryNamespace := doc.DocumentNamespace
	doc.ContainedIn(Package{Name: "onboarding-agent", VersionInfo: "1.2.3", PackageFileName: "onboarding-agent_1.2.3_linux_amd64.deb",
		DownloadLocation: "NOASSERTION", Checksums: []Checksum{{Algorithm: "SHA256", ChecksumValue: "abc123"}}})

	if got := doc.Packages[0].SPDXID; got != "SPDXRef-Package-artifact" {
		t.Errorf("first package %s, want the artifact", got)
	}
	want := map[Relationship]bool{
		{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: "SPDXRef-Package-artifact"}:    false,
		{Element: "SPDXRef-Package-artifact", Type: "CONTAINS", Related: "SPDXRef-Package-main"}: false,
	}
	for _, r := range doc.Relationships {
		if _, ok := want[r]; ok {
			want[r] = true
		}
		if r.Type == "DESCRIBES" && r.Related != "SPDXRef-Package-artifact" {
			t.Errorf("document still describes %s", r.Related)
		}
	}
	for r, found := range want {
		if !found {
			t.Errorf("no relationship %+v", r)
		}
	}
	if doc.Name != "onboarding-agent 1.2.3 onboarding-agent_1.2.3_linux_amd64.deb" {
		t.Errorf("name %q", doc.Name)
	}
	if doc.DocumentNamespace == binaryNamespace || doc.DocumentNamespace != "https://github.com/embark-mesh/embark/spdx/onboarding-agent_1.2.3_linux_amd64.deb-abc123" {
		t.Errorf("namespace %q (binary's %q)", doc.DocumentNamespace, binaryNamespace)
	}
}
