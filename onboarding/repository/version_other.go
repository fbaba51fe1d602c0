//go:build !linux

package repository

import "io/fs"

type fileVersion struct{}

// versionOf: without an inode and change time the checksum is computed on
// every request.
func versionOf(fs.FileInfo) (fileVersion, bool) { return fileVersion{}, false }
