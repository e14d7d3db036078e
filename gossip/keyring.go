package gossip

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/memberlist"
)

// The gossip key file holds one or more base64 AES keys (16, 24 or 32 bytes),
// one per line; blank lines and lines starting with '#' are ignored. The first
// key is the primary: it encrypts. The others only decrypt, which is what makes
// a rotation without a split cluster possible:
//
//  1. add the new key as the second line on every server, reload;
//  2. move it to the first line on every server, reload;
//  3. remove the old key on every server, reload.
//
// Between steps every server can read what every other server sends.

// LoadKeyring reads a gossip key file into a memberlist keyring whose primary
// key is the file's first key. The file must not be readable by group or
// others (mode 0600 or 0400).
func LoadKeyring(path string) (*memberlist.Keyring, error) {
	keys, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	kr, err := memberlist.NewKeyring(keys[1:], keys[0])
	if err != nil {
		return nil, fmt.Errorf("gossip key file %s: %w", path, err)
	}
	return kr, nil
}

// GenerateKey returns a new random 32-byte (AES-256) gossip key in base64,
// ready to be written as a line of the key file.
func GenerateKey() (string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("gossip: generate key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(key), nil
}

// readKeyFile returns the keys of a key file, primary first, without duplicates.
func readKeyFile(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gossip key file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("gossip key file %s has mode %04o: it must not be readable by group or others; run chmod 600 %s", path, perm, path)
	}

	var keys [][]byte
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			// The key itself is never echoed: it may be a real key with a typo.
			return nil, fmt.Errorf("gossip key file %s line %d: not valid base64; write one base64 key per line (for example the output of `head -c 32 /dev/urandom | base64`)", path, line)
		}
		if err := memberlist.ValidateKey(key); err != nil {
			return nil, fmt.Errorf("gossip key file %s line %d: key is %d bytes; it must be 16, 24 or 32 bytes (AES-128/192/256)", path, line, len(key))
		}
		if containsKey(keys, key) {
			return nil, fmt.Errorf("gossip key file %s line %d: the same key appears on an earlier line", path, line)
		}
		keys = append(keys, key)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("gossip key file %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("gossip key file %s holds no key; write one base64 key per line", path)
	}
	return keys, nil
}

func containsKey(keys [][]byte, key []byte) bool {
	for _, k := range keys {
		if bytes.Equal(k, key) {
			return true
		}
	}
	return false
}

// ReloadKeys applies the key file at path to the running keyring: keys new in
// the file are added, the file's first key becomes primary, and keys no longer
// in the file are removed. A cluster started without encryption cannot be
// switched to it by a reload; restart it with a key file.
func (c *Cluster) ReloadKeys(path string) error {
	if c.keyring == nil {
		return errors.New("gossip: cannot load keys into a cluster started without encryption (--insecure-gossip); restart it with --gossip-key-file")
	}
	keys, err := readKeyFile(path)
	if err != nil {
		return err
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	for _, k := range keys {
		if err := c.keyring.AddKey(k); err != nil {
			return fmt.Errorf("gossip key file %s: add key: %w", path, err)
		}
	}
	if err := c.keyring.UseKey(keys[0]); err != nil {
		return fmt.Errorf("gossip key file %s: use primary key: %w", path, err)
	}
	// GetKeys returns the keyring's own slice; copy before removing from it.
	var stale [][]byte
	for _, k := range c.keyring.GetKeys() {
		if !containsKey(keys, k) {
			stale = append(stale, bytes.Clone(k))
		}
	}
	for _, k := range stale {
		if err := c.keyring.RemoveKey(k); err != nil {
			return fmt.Errorf("gossip key file %s: remove old key: %w", path, err)
		}
	}
	c.log.Info("gossip keys reloaded", "file", path, "keys", len(keys), "removed", len(stale))
	return nil
}
