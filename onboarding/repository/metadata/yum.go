package metadata

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/embark-mesh/embark/onboarding/repository/rpmfile"
)

// RPMEntry is one package of a yum repository.
type RPMEntry struct {
	// Href is the package's path relative to the repository root (the
	// baseurl).
	Href   string
	Size   int64
	SHA256 string
	// MTime is the file's modification time, Unix seconds.
	MTime   int64
	Package rpmfile.Package
}

// Yum returns a yum repository's repodata: repodata/repomd.xml (unsigned;
// the caller signs it into repomd.xml.asc) and the primary, filelists and
// other files it names (gzipped, named by their checksum).
func Yum(entries []RPMEntry, revision int64) (repomd []byte, files []File) {
	sorted := append([]RPMEntry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Href < sorted[j].Href })

	var primary, filelists, other bytes.Buffer
	n := len(sorted)
	fmt.Fprintf(&primary, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<metadata xmlns=\"http://linux.duke.edu/metadata/common\" xmlns:rpm=\"http://linux.duke.edu/metadata/rpm\" packages=\"%d\">\n", n)
	fmt.Fprintf(&filelists, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<filelists xmlns=\"http://linux.duke.edu/metadata/filelists\" packages=\"%d\">\n", n)
	fmt.Fprintf(&other, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<otherdata xmlns=\"http://linux.duke.edu/metadata/other\" packages=\"%d\">\n", n)
	for _, e := range sorted {
		writePrimary(&primary, e)
		p := e.Package
		id := fmt.Sprintf("pkgid=%s name=%s arch=%s", attr(e.SHA256), attr(p.Name), attr(p.Arch))
		ver := fmt.Sprintf("<version epoch=%s ver=%s rel=%s/>", attr(strconv.Itoa(p.Epoch)), attr(p.Version), attr(p.Release))
		fmt.Fprintf(&filelists, "<package %s>\n  %s\n", id, ver)
		for _, f := range p.Files {
			if p.Dirs[f] {
				fmt.Fprintf(&filelists, "  <file type=\"dir\">%s</file>\n", text(f))
			} else {
				fmt.Fprintf(&filelists, "  <file>%s</file>\n", text(f))
			}
		}
		filelists.WriteString("</package>\n")
		fmt.Fprintf(&other, "<package %s>\n  %s\n</package>\n", id, ver)
	}
	primary.WriteString("</metadata>\n")
	filelists.WriteString("</filelists>\n")
	other.WriteString("</otherdata>\n")

	var md bytes.Buffer
	fmt.Fprintf(&md, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<repomd xmlns=\"http://linux.duke.edu/metadata/repo\" xmlns:rpm=\"http://linux.duke.edu/metadata/rpm\">\n  <revision>%d</revision>\n", revision)
	for _, d := range []struct {
		kind string
		data []byte
	}{{"primary", primary.Bytes()}, {"filelists", filelists.Bytes()}, {"other", other.Bytes()}} {
		z := gz(d.data)
		sum := SHA256(z)
		name := "repodata/" + sum + "-" + d.kind + ".xml.gz"
		files = append(files, File{name, z})
		fmt.Fprintf(&md, `  <data type="%s">
    <checksum type="sha256">%s</checksum>
    <open-checksum type="sha256">%s</open-checksum>
    <location href="%s"/>
    <timestamp>%d</timestamp>
    <size>%d</size>
    <open-size>%d</open-size>
  </data>
`, d.kind, sum, SHA256(d.data), name, revision, len(z), len(d.data))
	}
	md.WriteString("</repomd>\n")
	return md.Bytes(), files
}

func writePrimary(b *bytes.Buffer, e RPMEntry) {
	p := e.Package
	fmt.Fprintf(b, `<package type="rpm">
  <name>%s</name>
  <arch>%s</arch>
  <version epoch=%s ver=%s rel=%s/>
  <checksum type="sha256" pkgid="YES">%s</checksum>
  <summary>%s</summary>
  <description>%s</description>
  <packager>%s</packager>
  <url>%s</url>
  <time file="%d" build="%d"/>
  <size package="%d" installed="%d" archive="%d"/>
  <location href=%s/>
  <format>
    <rpm:license>%s</rpm:license>
    <rpm:vendor>%s</rpm:vendor>
    <rpm:group>%s</rpm:group>
    <rpm:buildhost>%s</rpm:buildhost>
    <rpm:sourcerpm>%s</rpm:sourcerpm>
    <rpm:header-range start="%d" end="%d"/>
`, text(p.Name), text(p.Arch), attr(strconv.Itoa(p.Epoch)), attr(p.Version), attr(p.Release), text(e.SHA256),
		text(p.Summary), text(p.Description), text(p.Packager), text(p.URL), e.MTime, p.BuildTime,
		e.Size, p.InstalledSize, p.ArchiveSize, attr(e.Href),
		text(p.License), text(p.Vendor), text(p.Group), text(p.BuildHost), text(p.SourceRPM), p.HeaderStart, p.HeaderEnd)
	writeDeps(b, "provides", p.Provides, false)
	writeDeps(b, "requires", p.Requires, true)
	writeDeps(b, "conflicts", p.Conflicts, false)
	writeDeps(b, "obsoletes", p.Obsoletes, false)
	// As createrepo: primary lists the files dependencies usually name
	// (/etc, bin directories); filelists has them all.
	for _, f := range p.Files {
		if strings.HasPrefix(f, "/etc/") || strings.Contains(f, "bin/") || f == "/usr/lib/sendmail" {
			if p.Dirs[f] {
				fmt.Fprintf(b, "    <file type=\"dir\">%s</file>\n", text(f))
			} else {
				fmt.Fprintf(b, "    <file>%s</file>\n", text(f))
			}
		}
	}
	b.WriteString("  </format>\n</package>\n")
}

// RPMSENSE bits (rpmds.h).
const (
	senseLess       = 1 << 1
	senseGreater    = 1 << 2
	senseEqual      = 1 << 3
	sensePreReq     = 1 << 6
	senseScriptPre  = 1 << 9
	senseScriptPost = 1 << 10
)

func writeDeps(b *bytes.Buffer, kind string, deps []rpmfile.Dependency, requires bool) {
	var lines []string
	seen := map[string]bool{}
	for _, d := range deps {
		if requires && strings.HasPrefix(d.Name, "rpmlib(") {
			continue // rpm's own features: createrepo leaves them out
		}
		line := "      <rpm:entry name=" + attr(d.Name)
		if op := map[uint32]string{senseLess: "LT", senseGreater: "GT", senseEqual: "EQ", senseLess | senseEqual: "LE", senseGreater | senseEqual: "GE"}[d.Flags&(senseLess|senseGreater|senseEqual)]; op != "" && d.Version != "" {
			epoch, ver, rel := splitEVR(d.Version)
			line += " flags=\"" + op + "\" epoch=" + attr(epoch) + " ver=" + attr(ver)
			if rel != "" {
				line += " rel=" + attr(rel)
			}
		}
		if requires && d.Flags&(sensePreReq|senseScriptPre|senseScriptPost) != 0 {
			line += ` pre="1"`
		}
		line += "/>"
		if !seen[line] {
			seen[line] = true
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "    <rpm:%s>\n%s\n    </rpm:%s>\n", kind, strings.Join(lines, "\n"), kind)
}

// splitEVR splits [epoch:]version[-release]; the epoch defaults to 0.
func splitEVR(s string) (epoch, ver, rel string) {
	epoch = "0"
	if e, rest, ok := strings.Cut(s, ":"); ok {
		if _, err := strconv.Atoi(e); err == nil {
			epoch, s = e, rest
		}
	}
	ver, rel, _ = strings.Cut(s, "-")
	return epoch, ver, rel
}

// text escapes s for XML character data (invalid characters become U+FFFD).
func text(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

// attr is s as a quoted XML attribute value.
func attr(s string) string { return `"` + text(s) + `"` }
