// Package debfile reads the control paragraph of a Debian binary package
// (an ar archive of debian-binary, control.tar[.gz] and data.tar.*), the
// part an apt Packages index repeats. Packages come from the operator's
// repository directory; the reader is bounded (member and control sizes)
// and validates the paragraph so that it cannot add stanzas or fields the
// index writes itself.
package debfile

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// MaxControl bounds the control archive and the control file read from it.
const MaxControl = 1 << 20

// ErrInvalid means the file is not a Debian binary package this reader
// accepts.
var ErrInvalid = errors.New("invalid deb package")

// Field is one control field; Value keeps continuation lines as they are
// ("line1\n line2").
type Field struct {
	Name, Value string
}

// Control is a package's control paragraph.
type Control struct {
	Fields []Field
}

// Get returns the named field's value (field names are case-insensitive).
func (c Control) Get(name string) string {
	for _, f := range c.Fields {
		if strings.EqualFold(f.Name, name) {
			return f.Value
		}
	}
	return ""
}

// Read reads the control paragraph of the package r.
func Read(r io.Reader) (Control, error) {
	br := bufio.NewReader(r)
	magic := make([]byte, 8)
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != "!<arch>\n" {
		return Control{}, fmt.Errorf("%w: no ar archive", ErrInvalid)
	}
	for member := 0; ; member++ {
		var hdr [60]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return Control{}, fmt.Errorf("%w: no control archive", ErrInvalid)
		}
		if string(hdr[58:60]) != "`\n" {
			return Control{}, fmt.Errorf("%w: bad ar member header", ErrInvalid)
		}
		name := strings.TrimSuffix(strings.TrimRight(string(hdr[0:16]), " "), "/")
		size, err := strconv.ParseInt(strings.TrimRight(string(hdr[48:58]), " "), 10, 64)
		if err != nil || size < 0 {
			return Control{}, fmt.Errorf("%w: bad ar member size", ErrInvalid)
		}
		if member == 0 && name != "debian-binary" {
			return Control{}, fmt.Errorf("%w: first member is %q, want debian-binary", ErrInvalid, name)
		}
		if strings.HasPrefix(name, "control.tar") {
			if size > MaxControl {
				return Control{}, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, name, MaxControl)
			}
			return readControlTar(name, io.LimitReader(br, size))
		}
		if member > 2 {
			return Control{}, fmt.Errorf("%w: no control archive", ErrInvalid)
		}
		if _, err := br.Discard(int(min(size+size%2, MaxControl+1))); err != nil || size > MaxControl {
			return Control{}, fmt.Errorf("%w: member %s: truncated or too large before the control archive", ErrInvalid, name)
		}
	}
}

func readControlTar(name string, r io.Reader) (Control, error) {
	switch name {
	case "control.tar":
	case "control.tar.gz":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return Control{}, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
		}
		r = zr
	default:
		return Control{}, fmt.Errorf("%w: %s: only control.tar and control.tar.gz are read", ErrInvalid, name)
	}
	tr := tar.NewReader(io.LimitReader(r, 4*MaxControl))
	for {
		h, err := tr.Next()
		if err != nil {
			return Control{}, fmt.Errorf("%w: %s has no control file", ErrInvalid, name)
		}
		if h.Typeflag != tar.TypeReg || (h.Name != "./control" && h.Name != "control") {
			continue
		}
		if h.Size > MaxControl {
			return Control{}, fmt.Errorf("%w: control file is larger than %d bytes", ErrInvalid, MaxControl)
		}
		b, err := io.ReadAll(io.LimitReader(tr, MaxControl))
		if err != nil {
			return Control{}, fmt.Errorf("%w: control file: %w", ErrInvalid, err)
		}
		return Parse(b)
	}
}

// Parse parses one control paragraph: "Name: value" lines and their
// continuation lines (starting with a space or tab). Blank lines inside
// (a second paragraph), comments, duplicate fields, control characters and
// field names outside the Debian policy's characters are errors. A trailing
// newline run is allowed.
func Parse(b []byte) (Control, error) {
	text := strings.TrimRight(string(b), "\n")
	if text == "" {
		return Control{}, fmt.Errorf("%w: empty control file", ErrInvalid)
	}
	var c Control
	seen := map[string]bool{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSuffix(line, "\r")
		for _, r := range line {
			if r < 0x20 && r != '\t' || r == 0x7f {
				return Control{}, fmt.Errorf("%w: control line %d has a control character", ErrInvalid, i+1)
			}
		}
		switch {
		case strings.TrimSpace(line) == "":
			return Control{}, fmt.Errorf("%w: control line %d is blank (one paragraph only)", ErrInvalid, i+1)
		case line[0] == ' ' || line[0] == '\t':
			if len(c.Fields) == 0 {
				return Control{}, fmt.Errorf("%w: control line %d continues no field", ErrInvalid, i+1)
			}
			c.Fields[len(c.Fields)-1].Value += "\n" + line
		default:
			name, value, ok := strings.Cut(line, ":")
			if !ok || !validName(name) {
				return Control{}, fmt.Errorf("%w: control line %d is no field", ErrInvalid, i+1)
			}
			key := strings.ToLower(name)
			if seen[key] {
				return Control{}, fmt.Errorf("%w: field %s repeated", ErrInvalid, name)
			}
			seen[key] = true
			c.Fields = append(c.Fields, Field{Name: name, Value: strings.TrimSpace(value)})
		}
	}
	for _, f := range []string{"Package", "Version", "Architecture"} {
		if strings.ContainsAny(c.Get(f), " \t\n") || c.Get(f) == "" {
			return Control{}, fmt.Errorf("%w: field %s missing or not one word", ErrInvalid, f)
		}
	}
	return c, nil
}

// validName: Debian policy 5.1, US-ASCII except controls, space and colon,
// not starting with # or -.
func validName(s string) bool {
	if s == "" || s[0] == '#' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f || s[i] == ':' {
			return false
		}
	}
	return true
}

// Paragraph writes the paragraph back without the named fields (those an
// index adds itself), ending with a newline.
func (c Control) Paragraph(without ...string) string {
	var b bytes.Buffer
	for _, f := range c.Fields {
		skip := false
		for _, w := range without {
			skip = skip || strings.EqualFold(f.Name, w)
		}
		if skip {
			continue
		}
		b.WriteString(f.Name + ": " + f.Value + "\n")
	}
	return b.String()
}
