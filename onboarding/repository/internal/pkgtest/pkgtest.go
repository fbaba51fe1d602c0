// Package pkgtest builds small but well-formed DEB and RPM packages and
// OpenPGP keys for the repository's tests and fuzz seeds: the layouts dpkg
// and rpm write, with only the parts the repository reads.
package pkgtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"sort"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
)

// Deb returns a Debian binary package with the control paragraph control
// (control.tar.gz) and an empty data.tar.gz.
func Deb(control string) []byte {
	var ar bytes.Buffer
	ar.WriteString("!<arch>\n")
	member := func(name string, data []byte) {
		fmt.Fprintf(&ar, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", name, 0, 0, 0, "100644", len(data))
		ar.Write(data)
		if len(data)%2 == 1 {
			ar.WriteByte('\n')
		}
	}
	member("debian-binary", []byte("2.0\n"))
	member("control.tar.gz", targz(map[string]string{"./control": control}))
	member("data.tar.gz", targz(nil))
	return ar.Bytes()
}

func targz(files map[string]string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		_ = tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(files[n]))
	}
	_ = tw.Close()
	_ = zw.Close()
	return b.Bytes()
}

// DebControl is a control paragraph for name, version and arch.
func DebControl(name, version, arch string) string {
	return fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: Embark <embark@example.invalid>\nDescription: %s for tests\n more text\n", name, version, arch, name)
}

// RPMTag is one header entry: a string, []string, int32, []int32 or
// []uint16 value.
type RPMTag struct {
	Tag   uint32
	Value any
}

// RPM returns an RPM package (lead, an empty signature header, the main
// header with tags, and payload bytes).
func RPM(tags []RPMTag, payload []byte) []byte {
	var out bytes.Buffer
	lead := make([]byte, 96)
	copy(lead, []byte{0xed, 0xab, 0xee, 0xdb, 3, 0})
	out.Write(lead)
	out.Write(Header(nil)) // 16 bytes: already a multiple of 8
	out.Write(Header(tags))
	out.Write(payload)
	return out.Bytes()
}

// Header is one RPM header structure with tags.
func Header(tags []RPMTag) []byte {
	var index, store bytes.Buffer
	for _, t := range tags {
		var typ, count uint32
		switch v := t.Value.(type) {
		case string:
			typ, count = 6, 1
			store.WriteString(v + "\x00")
		case []string:
			typ, count = 8, uint32(len(v))
			for _, s := range v {
				store.WriteString(s + "\x00")
			}
		case int32:
			for store.Len()%4 != 0 {
				store.WriteByte(0)
			}
			typ, count = 4, 1
			_ = binary.Write(&store, binary.BigEndian, v)
		case []int32:
			for store.Len()%4 != 0 {
				store.WriteByte(0)
			}
			typ, count = 4, uint32(len(v))
			_ = binary.Write(&store, binary.BigEndian, v)
		case []uint16:
			for store.Len()%2 != 0 {
				store.WriteByte(0)
			}
			typ, count = 3, uint32(len(v))
			_ = binary.Write(&store, binary.BigEndian, v)
		default:
			panic(fmt.Sprintf("pkgtest: tag %d: %T", t.Tag, v))
		}
		off := uint32(store.Len())
		switch v := t.Value.(type) {
		case string:
			off -= uint32(len(v) + 1)
		case []string:
			for _, s := range v {
				off -= uint32(len(s) + 1)
			}
		case int32:
			off -= 4
		case []int32:
			off -= 4 * uint32(len(v))
		case []uint16:
			off -= 2 * uint32(len(v))
		}
		_ = binary.Write(&index, binary.BigEndian, [4]uint32{t.Tag, typ, off, count})
	}
	var h bytes.Buffer
	h.Write([]byte{0x8e, 0xad, 0xe8, 0x01, 0, 0, 0, 0})
	_ = binary.Write(&h, binary.BigEndian, [2]uint32{uint32(len(tags)), uint32(store.Len())})
	h.Write(index.Bytes())
	h.Write(store.Bytes())
	return h.Bytes()
}

// SimpleRPM is an RPM of name, version and arch with one binary, a
// directory, a configuration file and a few dependencies.
func SimpleRPM(name, version, arch string) []byte {
	return RPM([]RPMTag{
		{1000, name}, {1001, version}, {1002, "1"}, {1004, name + " for tests"}, {1005, "A package <built> & \"quoted\"."},
		{1006, int32(1700000000)}, {1009, int32(4096)}, {1014, "Apache-2.0"}, {1022, arch},
		{1047, []string{name, name + "(" + arch + ")"}}, {1112, []int32{8, 8}}, {1113, []string{version + "-1", version + "-1"}},
		{1049, []string{"/bin/sh", "rpmlib(CompressedFileNames)"}}, {1048, []int32{1 << 9, 1<<24 | 8 | 2}}, {1050, []string{"", "3.0.4-1"}},
		{1117, []string{name, name, "config.yaml"}}, {1116, []int32{0, 1, 2}}, {1118, []string{"/usr/bin/", "/var/lib/", "/etc/" + name + "/"}},
		{1030, []uint16{0o100755, 0o40750, 0o100644}},
	}, bytes.Repeat([]byte("payload "), 64))
}

// Key returns a new armored OpenPGP private key and its armored public key.
func Key(t testing.TB, name string) (private, public []byte) {
	t.Helper()
	return key(t, name, nil)
}

// EncryptedKey is Key with the private key protected by passphrase.
func EncryptedKey(t testing.TB, name, passphrase string) (private, public []byte) {
	t.Helper()
	return key(t, name, []byte(passphrase))
}

func key(t testing.TB, name string, passphrase []byte) (private, public []byte) {
	e, err := openpgp.NewEntity(name, "test", name+"@example.invalid", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	if passphrase != nil {
		if err := e.EncryptPrivateKeys(passphrase, nil); err != nil {
			t.Fatal(err)
		}
	}
	arm := func(typ string, write func(w *bytes.Buffer) error) []byte {
		var raw, out bytes.Buffer
		if err := write(&raw); err != nil {
			t.Fatal(err)
		}
		w, err := armor.Encode(&out, typ, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write(raw.Bytes())
		_ = w.Close()
		return out.Bytes()
	}
	private = arm(openpgp.PrivateKeyType, func(w *bytes.Buffer) error {
		if passphrase != nil {
			return e.SerializePrivateWithoutSigning(w, nil)
		}
		return e.SerializePrivate(w, nil)
	})
	public = arm(openpgp.PublicKeyType, func(w *bytes.Buffer) error { return e.Serialize(w) })
	return private, public
}
