package debfile_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/repository/debfile"
	"github.com/embark-mesh/embark/onboarding/repository/internal/pkgtest"
)

func TestRead(t *testing.T) {
	c, err := debfile.Read(bytes.NewReader(pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "1.2.3", "arm64"))))
	if err != nil {
		t.Fatal(err)
	}
	if c.Get("package") != "onboarding-agent" || c.Get("Version") != "1.2.3" || c.Get("Architecture") != "arm64" {
		t.Fatalf("got %+v", c)
	}
	if got, want := c.Get("Description"), "onboarding-agent for tests\n more text"; got != want {
		t.Fatalf("Description %q, want %q", got, want)
	}
}

func TestParseRefuses(t *testing.T) {
	base := "Package: a\nVersion: 1\nArchitecture: amd64\n"
	for _, tc := range []struct {
		name, control string
	}{
		{"second paragraph (an injected stanza)", base + "\nPackage: evil\nVersion: 1\nArchitecture: amd64\n"},
		{"blank continuation", base + "Description: x\n \n"},
		{"repeated field", base + "Package: b\n"},
		{"no colon", base + "Oops\n"},
		{"continuation first", " x\n" + base},
		{"control character", base + "Description: a\x1bb\n"},
		{"comment", base + "#x: y\n"},
		{"two-word package", "Package: a b\nVersion: 1\nArchitecture: amd64\n"},
		{"no version", "Package: a\nArchitecture: amd64\n"},
		{"empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := debfile.Parse([]byte(tc.control)); !errors.Is(err, debfile.ErrInvalid) {
				t.Fatalf("Parse: %v, want ErrInvalid", err)
			}
		})
	}
}

func TestReadRefuses(t *testing.T) {
	good := pkgtest.Deb(pkgtest.DebControl("a", "1", "amd64"))
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"not ar", []byte("hello world, not a package")},
		{"truncated", good[:len(good)/3]},
		{"control.tar.xz", bytes.Replace(good, []byte("control.tar.gz"), []byte("control.tar.xz"), 1)},
		{"first member not debian-binary", bytes.Replace(good, []byte("debian-binary  "), []byte("debian-binarx  "), 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := debfile.Read(bytes.NewReader(tc.data)); !errors.Is(err, debfile.ErrInvalid) {
				t.Fatalf("Read: %v, want ErrInvalid", err)
			}
		})
	}
}

func TestParagraphDropsIndexFields(t *testing.T) {
	c, err := debfile.Parse([]byte("Package: a\nVersion: 1\nArchitecture: amd64\nFilename: ../../etc/passwd\nSHA256: 00\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Paragraph("Filename", "sha256"); got != "Package: a\nVersion: 1\nArchitecture: amd64\n" {
		t.Fatalf("Paragraph: %q", got)
	}
}

// FuzzRead: any input is an error or a paragraph that parses back to
// itself, has no blank line (no second stanza) and names one package.
func FuzzRead(f *testing.F) {
	f.Add(pkgtest.Deb(pkgtest.DebControl("onboarding-agent", "1.0", "amd64")))
	f.Add(pkgtest.Deb("Package: a\nVersion: 1\nArchitecture: all\n\nPackage: b\n"))
	f.Add([]byte("!<arch>\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := debfile.Read(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, debfile.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		p := c.Paragraph()
		if strings.Contains(p, "\n\n") || strings.HasPrefix(p, "\n") {
			t.Fatalf("paragraph with a blank line: %q", p)
		}
		again, err := debfile.Parse([]byte(p))
		if err != nil || again.Paragraph() != p {
			t.Fatalf("paragraph %q does not parse back: %v", p, err)
		}
	})
}

// FuzzParse: as FuzzRead, for the control paragraph alone.
func FuzzParse(f *testing.F) {
	f.Add([]byte(pkgtest.DebControl("istio-sidecar", "1:1.30.0-1", "arm64")))
	f.Add([]byte("Package: a\nVersion: 1\nArchitecture: amd64\nDescription:\n .\n x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := debfile.Parse(data)
		if err != nil {
			return
		}
		p := c.Paragraph()
		if strings.Contains(p, "\n\n") {
			t.Fatalf("paragraph with a blank line: %q", p)
		}
		again, err := debfile.Parse([]byte(p))
		if err != nil || again.Paragraph() != p {
			t.Fatalf("paragraph %q does not parse back: %v", p, err)
		}
	})
}
