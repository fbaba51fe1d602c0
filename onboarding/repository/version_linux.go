//go:build linux

package repository

import (
	"io/fs"
	"syscall"
)

// fileVersion identifies one version of a file's content.
type fileVersion struct {
	dev, ino         uint64
	size             int64
	mtimeNs, ctimeNs int64
}

// versionOf returns info's version; false when the platform gives no inode
// and change time (the checksum is then computed on every request).
func versionOf(info fs.FileInfo) (fileVersion, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fileVersion{}, false
	}
	return fileVersion{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano(),
	}, true
}
