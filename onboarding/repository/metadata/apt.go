// Package metadata writes the indexes apt and dnf read from a repository:
// apt's Packages and Release files (Debian repository format, flat
// components under dists/<suite>/) and yum/dnf's repodata (repomd.xml,
// primary, filelists, other). It is pure: package facts in, file contents
// out; signing and serving are the caller's.
package metadata

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/repository/debfile"
)

// DebEntry is one package of a Packages index.
type DebEntry struct {
	// Filename is the package's path relative to the archive root.
	Filename string
	Size     int64
	SHA256   string
	Control  debfile.Control
}

// indexFields are the fields a Packages index writes itself; a package's
// own control file never sets them.
var indexFields = []string{"Filename", "Size", "MD5sum", "SHA1", "SHA256", "SHA512", "Description-md5"}

// Packages writes a Packages index of entries, sorted by package name,
// version and file name.
func Packages(entries []DebEntry) []byte {
	sorted := append([]DebEntry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if x, y := a.Control.Get("Package"), b.Control.Get("Package"); x != y {
			return x < y
		}
		return a.Filename < b.Filename
	})
	var b bytes.Buffer
	for i, e := range sorted {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Control.Paragraph(indexFields...))
		fmt.Fprintf(&b, "Filename: %s\nSize: %d\n", e.Filename, e.Size)
		fmt.Fprintf(&b, "SHA256: %s\n", e.SHA256)
	}
	return b.Bytes()
}

// File is one generated file, its path relative to the directory its index
// lives in (dists/<suite>/ for apt, the repository root for yum).
type File struct {
	Path string
	Data []byte
}

// Suite is one apt suite (dists/<Name>/) with one component, main.
type Suite struct {
	Name string
	// Packages per architecture (amd64, arm64); every architecture listed
	// gets an index, empty or not.
	Packages map[string][]DebEntry
	// Date is the Release file's date.
	Date time.Time
	// ValidUntil, when set, is the Release file's Valid-Until: apt refuses
	// the suite's metadata after it (the Release is signed, so a replayed
	// old snapshot cannot move it).
	ValidUntil time.Time
}

// Apt returns the suite's files below dists/<suite>/: Release (unsigned;
// the caller signs it into InRelease and Release.gpg) and, per
// architecture, main/binary-<arch>/Packages and Packages.gz.
func Apt(s Suite) (release []byte, files []File) {
	archs := make([]string, 0, len(s.Packages))
	for a := range s.Packages {
		archs = append(archs, a)
	}
	sort.Strings(archs)
	for _, a := range archs {
		plain := Packages(s.Packages[a])
		dir := "main/binary-" + a + "/"
		files = append(files, File{dir + "Packages", plain}, File{dir + "Packages.gz", gz(plain)})
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "Origin: Embark\nLabel: Embark\nSuite: %s\nCodename: %s\n", s.Name, s.Name)
	fmt.Fprintf(&b, "Date: %s\n", s.Date.UTC().Format(time.RFC1123))
	if !s.ValidUntil.IsZero() {
		fmt.Fprintf(&b, "Valid-Until: %s\n", s.ValidUntil.UTC().Format(time.RFC1123))
	}
	fmt.Fprintf(&b, "Architectures: %s\nComponents: main\n", strings.Join(archs, " "))
	b.WriteString("Description: Embark onboarding endpoint's local repository\nAcquire-By-Hash: yes\n")
	b.WriteString("SHA256:\n")
	for _, f := range files {
		fmt.Fprintf(&b, " %s %d %s\n", SHA256(f.Data), len(f.Data), f.Path)
	}
	return b.Bytes(), files
}

// SHA256 is the hex SHA-256 of b.
func SHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// gz compresses b with a zero modification time, so equal input gives
// equal output.
func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	_, _ = w.Write(b) // writes to a bytes.Buffer do not fail
	_ = w.Close()
	return out.Bytes()
}
