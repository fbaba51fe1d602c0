package rpmfile_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/embark-mesh/embark/onboarding/repository/internal/pkgtest"
	"github.com/embark-mesh/embark/onboarding/repository/rpmfile"
)

func TestRead(t *testing.T) {
	data := pkgtest.SimpleRPM("onboarding-agent", "1.2.3", "aarch64")
	p, err := rpmfile.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "onboarding-agent" || p.Version != "1.2.3" || p.Release != "1" || p.Arch != "aarch64" || p.License != "Apache-2.0" || p.BuildTime != 1700000000 || p.InstalledSize != 4096 {
		t.Fatalf("got %+v", p)
	}
	if want := []string{"/usr/bin/onboarding-agent", "/var/lib/onboarding-agent", "/etc/onboarding-agent/config.yaml"}; !slices.Equal(p.Files, want) {
		t.Fatalf("files %v, want %v", p.Files, want)
	}
	if !p.Dirs["/var/lib/onboarding-agent"] || p.Dirs["/usr/bin/onboarding-agent"] {
		t.Fatalf("dirs %v", p.Dirs)
	}
	if len(p.Requires) != 2 || p.Requires[1].Name != "rpmlib(CompressedFileNames)" || p.Requires[1].Version != "3.0.4-1" {
		t.Fatalf("requires %+v", p.Requires)
	}
	if p.HeaderStart != 96+16 || p.HeaderEnd <= p.HeaderStart || p.HeaderEnd > int64(len(data)) {
		t.Fatalf("header range %d-%d", p.HeaderStart, p.HeaderEnd)
	}
}

func TestReadRefuses(t *testing.T) {
	good := pkgtest.SimpleRPM("a", "1", "x86_64")
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"no lead", bytes.Repeat([]byte{1}, 200)},
		{"truncated", good[:150]},
		{"no name", pkgtest.RPM([]tag{tg(1001, "1"), tg(1022, "x86_64")}, nil)},
		{"name not a string", pkgtest.RPM([]tag{tg(1000, int32(1)), tg(1001, "1"), tg(1022, "x86_64")}, nil)},
		{"huge header", append(append(make([]byte, 0, 200), good[:96+16]...), 0x8e, 0xad, 0xe8, 0x01, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0)},
		{"unterminated string", pkgtest.RPM([]tag{tg(1000, "abc")}, nil)[:96+16+16+16+2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no lead" {
				tc.data[0] = 0
			}
			if _, err := rpmfile.Read(bytes.NewReader(tc.data)); !errors.Is(err, rpmfile.ErrInvalid) {
				t.Fatalf("Read: %v, want ErrInvalid", err)
			}
		})
	}
}

type tag = pkgtest.RPMTag

func tg(t uint32, v any) tag { return tag{Tag: t, Value: v} }

// FuzzRead: any input is ErrInvalid or a package with a name, version and
// architecture, absolute file paths and a header range inside the input.
func FuzzRead(f *testing.F) {
	f.Add(pkgtest.SimpleRPM("onboarding-agent", "1.0", "x86_64"))
	f.Add(pkgtest.RPM([]tag{tg(1000, "a"), tg(1001, "1"), tg(1022, "noarch"), tg(1117, []string{"x"}), tg(1116, []int32{5}), tg(1118, []string{"/"})}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := rpmfile.Read(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, rpmfile.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if p.Name == "" || p.Version == "" || p.Arch == "" {
			t.Fatalf("accepted without name, version or arch: %+v", p)
		}
		if p.HeaderStart < 96 || p.HeaderEnd <= p.HeaderStart || p.HeaderEnd > int64(len(data)) {
			t.Fatalf("header range %d-%d outside %d bytes", p.HeaderStart, p.HeaderEnd, len(data))
		}
		for _, f := range p.Files {
			if f == "" || f[0] != '/' {
				t.Fatalf("file %q", f)
			}
		}
	})
}
