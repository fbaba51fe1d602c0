// Package rpmfile reads the header of an RPM package (lead, signature
// header, main header), the part a yum/dnf repository's primary and
// filelists metadata repeat. Packages come from the operator's repository
// directory; the reader bounds every count and size and checks every
// offset, so a malformed file is an error, never a panic or a large
// allocation.
package rpmfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
)

// MaxHeader bounds a header's index and data store.
const MaxHeader = 32 << 20

// ErrInvalid means the file is not an RPM package this reader accepts.
var ErrInvalid = errors.New("invalid rpm package")

// Dependency is one provides/requires entry.
type Dependency struct {
	Name, Version string
	// Flags are RPMSENSE_* bits: 2 less, 4 greater, 8 equal; PreReq-like
	// bits (1<<6, 1<<9, 1<<10) mark a dependency of the install scripts.
	Flags uint32
}

// Package is what a repository index says about a package.
type Package struct {
	Name, Version, Release, Arch string
	Epoch                        int
	Summary, Description         string
	Packager, URL, License       string
	Vendor, Group, BuildHost     string
	SourceRPM                    string
	BuildTime                    int64
	InstalledSize, ArchiveSize   int64
	// HeaderStart and HeaderEnd are the main header's byte range in the file.
	HeaderStart, HeaderEnd int64
	Provides, Requires     []Dependency
	Conflicts, Obsoletes   []Dependency
	// Files are the package's paths; Dirs marks those that are directories.
	Files []string
	Dirs  map[string]bool
}

// Header tags (rpmtag.h).
const (
	tagName          = 1000
	tagVersion       = 1001
	tagRelease       = 1002
	tagEpoch         = 1003
	tagSummary       = 1004
	tagDescription   = 1005
	tagBuildTime     = 1006
	tagBuildHost     = 1007
	tagSize          = 1009
	tagVendor        = 1011
	tagLicense       = 1014
	tagPackager      = 1015
	tagGroup         = 1016
	tagURL           = 1020
	tagArch          = 1022
	tagFileModes     = 1030
	tagSourceRPM     = 1044
	tagArchiveSize   = 1046
	tagProvideName   = 1047
	tagRequireFlags  = 1048
	tagRequireName   = 1049
	tagRequireVer    = 1050
	tagConflictFlags = 1053
	tagConflictName  = 1054
	tagConflictVer   = 1055
	tagObsoleteName  = 1090
	tagProvideFlags  = 1112
	tagProvideVer    = 1113
	tagObsoleteFlags = 1114
	tagObsoleteVer   = 1115
	tagDirIndexes    = 1116
	tagBaseNames     = 1117
	tagDirNames      = 1118
	tagLongSize      = 5009
	tagLongArchive   = 271 // RPMSIGTAG_LONGARCHIVESIZE, in the signature header
	tagSigPayload    = 1007
)

// Data types.
const (
	typeInt16       = 3
	typeInt32       = 4
	typeInt64       = 5
	typeString      = 6
	typeStringArray = 8
	typeI18NString  = 9
)

type entry struct {
	tag, typ, offset, count uint32
}

type header struct {
	entries map[uint32]entry
	store   []byte
}

// Read reads the package r's headers.
func Read(r io.Reader) (Package, error) {
	var lead [96]byte
	if _, err := io.ReadFull(r, lead[:]); err != nil || !bytes.Equal(lead[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		return Package{}, fmt.Errorf("%w: no rpm lead", ErrInvalid)
	}
	sig, n, err := readHeader(r)
	if err != nil {
		return Package{}, fmt.Errorf("%w: signature header: %w", ErrInvalid, err)
	}
	// The signature header is padded to a multiple of 8 bytes.
	pad := (8 - n%8) % 8
	if _, err := io.ReadFull(r, make([]byte, pad)); err != nil {
		return Package{}, fmt.Errorf("%w: signature header padding", ErrInvalid)
	}
	start := int64(96) + n + pad
	h, m, err := readHeader(r)
	if err != nil {
		return Package{}, fmt.Errorf("%w: header: %w", ErrInvalid, err)
	}
	p := Package{HeaderStart: start, HeaderEnd: start + m}
	for _, s := range []struct {
		tag uint32
		dst *string
	}{
		{tagName, &p.Name}, {tagVersion, &p.Version}, {tagRelease, &p.Release}, {tagArch, &p.Arch},
		{tagSummary, &p.Summary}, {tagDescription, &p.Description}, {tagPackager, &p.Packager},
		{tagURL, &p.URL}, {tagLicense, &p.License}, {tagVendor, &p.Vendor}, {tagGroup, &p.Group},
		{tagBuildHost, &p.BuildHost}, {tagSourceRPM, &p.SourceRPM},
	} {
		if *s.dst, err = h.str(s.tag); err != nil {
			return Package{}, err
		}
	}
	if p.Name == "" || p.Version == "" || p.Arch == "" {
		return Package{}, fmt.Errorf("%w: no name, version or architecture", ErrInvalid)
	}
	var ints []int64
	if ints, err = h.ints(tagEpoch); err != nil {
		return Package{}, err
	} else if len(ints) > 0 {
		p.Epoch = int(ints[0])
	}
	if ints, err = h.ints(tagBuildTime); err != nil {
		return Package{}, err
	} else if len(ints) > 0 {
		p.BuildTime = ints[0]
	}
	for _, t := range []struct {
		h   *header
		tag uint32
		dst *int64
	}{{h, tagSize, &p.InstalledSize}, {h, tagLongSize, &p.InstalledSize}, {h, tagArchiveSize, &p.ArchiveSize}, {sig, tagSigPayload, &p.ArchiveSize}, {sig, tagLongArchive, &p.ArchiveSize}} {
		if ints, err = t.h.ints(t.tag); err != nil {
			return Package{}, err
		} else if len(ints) > 0 && *t.dst == 0 {
			*t.dst = ints[0]
		}
	}
	for _, d := range []struct {
		name, flags, ver uint32
		dst              *[]Dependency
	}{
		{tagProvideName, tagProvideFlags, tagProvideVer, &p.Provides},
		{tagRequireName, tagRequireFlags, tagRequireVer, &p.Requires},
		{tagConflictName, tagConflictFlags, tagConflictVer, &p.Conflicts},
		{tagObsoleteName, tagObsoleteFlags, tagObsoleteVer, &p.Obsoletes},
	} {
		if *d.dst, err = h.deps(d.name, d.flags, d.ver); err != nil {
			return Package{}, err
		}
	}
	if err := h.files(&p); err != nil {
		return Package{}, err
	}
	return p, nil
}

// readHeader reads one header structure and returns it with its size.
func readHeader(r io.Reader) (*header, int64, error) {
	var intro [16]byte
	if _, err := io.ReadFull(r, intro[:]); err != nil {
		return nil, 0, errors.New("truncated")
	}
	if !bytes.Equal(intro[:4], []byte{0x8e, 0xad, 0xe8, 0x01}) {
		return nil, 0, errors.New("bad magic")
	}
	nindex := binary.BigEndian.Uint32(intro[8:12])
	hsize := binary.BigEndian.Uint32(intro[12:16])
	if uint64(nindex)*16+uint64(hsize) > MaxHeader {
		return nil, 0, fmt.Errorf("larger than %d bytes", MaxHeader)
	}
	// Read before allocating: a short file claiming a large header costs
	// what it holds, not what it claims.
	want := int64(nindex)*16 + int64(hsize)
	var b bytes.Buffer
	if n, err := io.CopyN(&b, r, want); err != nil || n != want {
		return nil, 0, errors.New("truncated")
	}
	buf := b.Bytes()
	h := &header{entries: make(map[uint32]entry, nindex), store: buf[nindex*16:]}
	for i := range nindex {
		b := buf[i*16:]
		e := entry{binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])}
		if e.offset > hsize {
			return nil, 0, fmt.Errorf("tag %d: offset out of range", e.tag)
		}
		h.entries[e.tag] = e
	}
	return h, 16 + int64(len(buf)), nil
}

// strs returns a string, string array or i18n string tag's values (nil when
// the tag is absent).
func (h *header) strs(tag uint32) ([]string, error) {
	e, ok := h.entries[tag]
	if !ok {
		return nil, nil
	}
	if e.typ != typeString && e.typ != typeStringArray && e.typ != typeI18NString {
		return nil, fmt.Errorf("%w: tag %d is not a string", ErrInvalid, tag)
	}
	if e.typ == typeString && e.count != 1 {
		return nil, fmt.Errorf("%w: tag %d: count %d", ErrInvalid, tag, e.count)
	}
	if int64(e.count) > int64(len(h.store)) {
		return nil, fmt.Errorf("%w: tag %d: count out of range", ErrInvalid, tag)
	}
	data := h.store[e.offset:]
	out := make([]string, 0, e.count)
	for range e.count {
		i := bytes.IndexByte(data, 0)
		if i < 0 {
			return nil, fmt.Errorf("%w: tag %d: unterminated string", ErrInvalid, tag)
		}
		out = append(out, string(data[:i]))
		data = data[i+1:]
	}
	return out, nil
}

func (h *header) str(tag uint32) (string, error) {
	s, err := h.strs(tag)
	if err != nil || len(s) == 0 {
		return "", err
	}
	return s[0], nil // an i18n string's first value is the C locale's
}

// ints returns an integer tag's values (nil when the tag is absent).
func (h *header) ints(tag uint32) ([]int64, error) {
	e, ok := h.entries[tag]
	if !ok {
		return nil, nil
	}
	size := map[uint32]uint64{typeInt16: 2, typeInt32: 4, typeInt64: 8}[e.typ]
	if size == 0 {
		return nil, fmt.Errorf("%w: tag %d is not an integer", ErrInvalid, tag)
	}
	if uint64(e.offset)+uint64(e.count)*size > uint64(len(h.store)) {
		return nil, fmt.Errorf("%w: tag %d: data out of range", ErrInvalid, tag)
	}
	out := make([]int64, e.count)
	for i := range out {
		b := h.store[uint64(e.offset)+uint64(i)*size:]
		switch size {
		case 2:
			out[i] = int64(binary.BigEndian.Uint16(b))
		case 4:
			out[i] = int64(binary.BigEndian.Uint32(b))
		default:
			out[i] = int64(binary.BigEndian.Uint64(b))
		}
	}
	return out, nil
}

func (h *header) deps(nameTag, flagsTag, verTag uint32) ([]Dependency, error) {
	names, err := h.strs(nameTag)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	flags, err := h.ints(flagsTag)
	if err != nil {
		return nil, err
	}
	vers, err := h.strs(verTag)
	if err != nil {
		return nil, err
	}
	if (flags != nil && len(flags) != len(names)) || (vers != nil && len(vers) != len(names)) {
		return nil, fmt.Errorf("%w: tag %d: names, flags and versions differ in number", ErrInvalid, nameTag)
	}
	out := make([]Dependency, len(names))
	for i, n := range names {
		out[i].Name = n
		if flags != nil {
			out[i].Flags = uint32(flags[i])
		}
		if vers != nil {
			out[i].Version = vers[i]
		}
	}
	return out, nil
}

func (h *header) files(p *Package) error {
	base, err := h.strs(tagBaseNames)
	if err != nil || len(base) == 0 {
		return err
	}
	dirs, err := h.strs(tagDirNames)
	if err != nil {
		return err
	}
	idx, err := h.ints(tagDirIndexes)
	if err != nil {
		return err
	}
	modes, err := h.ints(tagFileModes)
	if err != nil {
		return err
	}
	if len(idx) != len(base) || (modes != nil && len(modes) != len(base)) {
		return fmt.Errorf("%w: file lists differ in length", ErrInvalid)
	}
	p.Dirs = map[string]bool{}
	for i, b := range base {
		if idx[i] < 0 || idx[i] >= int64(len(dirs)) {
			return fmt.Errorf("%w: file %d: directory index out of range", ErrInvalid, i)
		}
		f := dirs[idx[i]] + b
		if !path.IsAbs(f) {
			return fmt.Errorf("%w: file %q is not absolute", ErrInvalid, f)
		}
		p.Files = append(p.Files, f)
		if modes != nil && modes[i]&0o170000 == 0o040000 {
			p.Dirs[f] = true
		}
	}
	return nil
}
