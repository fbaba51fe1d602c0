package token

import (
	"fmt"
	"os"
	"sync/atomic"
)

// KeySource hands out the active key set. KeySet must not block and must be
// safe for concurrent use; it returns nil while no key set is loaded.
type KeySource interface {
	KeySet() *KeySet
}

var (
	_ KeySource = (*StaticKeySource)(nil)
	_ KeySource = (*SecretKeySource)(nil)
)

// StaticKeySource is a KeySource whose key set changes only when Set is
// called: keys from files, or tests.
type StaticKeySource struct {
	set atomic.Pointer[KeySet]
}

// NewStaticKeySource returns a source holding set (which may be nil).
func NewStaticKeySource(set *KeySet) *StaticKeySource {
	s := &StaticKeySource{}
	s.set.Store(set)
	return s
}

// LoadStaticKeySource reads the current key from currentFile and, when
// previousFile is not empty, the previous key from previousFile; both are
// PEM files as ParseKeyPEM accepts them.
func LoadStaticKeySource(currentFile, previousFile string) (*StaticKeySource, error) {
	current, err := loadKeyFile(currentFile)
	if err != nil {
		return nil, err
	}
	var previous *Key
	if previousFile != "" {
		if previous, err = loadKeyFile(previousFile); err != nil {
			return nil, err
		}
	}
	set, err := NewKeySet(current, previous)
	if err != nil {
		return nil, err
	}
	return NewStaticKeySource(set), nil
}

func loadKeyFile(path string) (*Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read signing key: %w", err)
	}
	k, err := ParseKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	return k, nil
}

// KeySet returns the key set.
func (s *StaticKeySource) KeySet() *KeySet { return s.set.Load() }

// Set replaces the key set atomically.
func (s *StaticKeySource) Set(set *KeySet) { s.set.Store(set) }
