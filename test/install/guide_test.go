package install

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestShBlocksBySection(t *testing.T) {
	const doc = "# Title\n\nintro\n\n```sh\nA=1\n```\n\n## One\n\n```yaml\nk: v\n```\n\n```sh\necho one\n# not a heading\n```\n\n" +
		"### Deeper\n\n~~~sh\necho deeper\n~~~\n\n## Empty\n\ntext\n"
	for _, tc := range []struct {
		name     string
		doc      string
		headings []string
		want     []string
		wantErr  string
	}{
		{name: "title block", doc: doc, headings: []string{"Title"}, want: []string{"A=1\n"}},
		{name: "section stops at a subsection", doc: doc, headings: []string{"One"}, want: []string{"echo one\n# not a heading\n"}},
		{name: "several, in order", doc: doc, headings: []string{"Deeper", "Title"}, want: []string{"echo deeper\n", "A=1\n"}},
		{name: "missing heading", doc: doc, headings: []string{"Two"}, wantErr: `no section "Two"`},
		{name: "no sh block", doc: doc, headings: []string{"Empty"}, wantErr: `section "Empty" has no`},
		{name: "unclosed fence", doc: "# T\n```sh\necho\n", headings: []string{"T"}, wantErr: "line 2: code fence never closed"},
		{name: "duplicate heading", doc: "# T\n## T\n", headings: []string{"T"}, wantErr: `heading "T" appears twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir() + "/guide.md"
			writeTestFile(t, path, tc.doc)
			got, err := GuideBlocks(path, tc.headings...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVMInstallGuideHasTheSectionsTheInstallTestRuns keeps docs/vm-install.md
// runnable by the install test without root: the sections it executes exist
// and have their sh blocks, with the placeholders an operator fills in.
func TestVMInstallGuideHasTheSectionsTheInstallTestRuns(t *testing.T) {
	for family, sections := range map[string][]string{"Debian/Ubuntu": guideSections, "RHEL": rhelGuideSections} {
		blocks, err := GuideBlocks("../../docs/vm-install.md", sections...)
		if err != nil {
			t.Fatalf("%s: %v", family, err)
		}
		all := strings.Join(blocks, "\n")
		for _, p := range []string{guideHostLine, guideKeysLine} {
			if !strings.Contains(all, p) {
				t.Errorf("%s: the guide's blocks have no %q for the operator to fill in", family, p)
			}
		}
	}
}

func FuzzShBlocksBySection(f *testing.F) {
	f.Add("# T\n```sh\necho\n```\n## U\n~~~\n# x\n~~~\n")
	f.Add("```sh\n")
	f.Fuzz(func(t *testing.T, doc string) {
		sections, err := shBlocksBySection(doc)
		if err != nil {
			return
		}
		for h, blocks := range sections {
			for _, b := range blocks {
				if !strings.HasSuffix(b, "\n") && b != "" {
					t.Fatalf("section %q: block %q does not end a line", h, b)
				}
			}
		}
	})
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
