package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tokenEnv is the environment variable holding a join token.
const tokenEnv = "TETHER_TOKEN"

// joinTokenFile is the token a coordinator generates in its data directory
// when it is given none.
const joinTokenFile = "join-token"

// readTokenFile reads a join token file, trimming whitespace. An empty token
// is an error naming the file.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// resolveToken picks a join token: the file if named, else envValue if set,
// else (when genDir is not empty) genDir/join-token, generated on first use.
// It returns the token and where it came from (a path, or "$TETHER_TOKEN").
func resolveToken(file, envValue, genDir string) (token, source string, err error) {
	switch {
	case file != "":
		tok, err := readTokenFile(file)
		return tok, file, err
	case strings.TrimSpace(envValue) != "":
		return strings.TrimSpace(envValue), "$" + tokenEnv, nil
	case genDir == "":
		return "", "", fmt.Errorf("no join token: give --token-file or set %s", tokenEnv)
	}
	path := filepath.Join(genDir, joinTokenFile)
	tok, err := loadOrCreateSecret(path)
	return tok, path, err
}

// loadOrCreateSecret reads the secret (one line) in path, or creates path
// (0600) with 32 random bytes in hex when it does not exist.
func loadOrCreateSecret(path string) (string, error) {
	tok, err := readTokenFile(path)
	if err == nil {
		return tok, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var b [32]byte
	rand.Read(b[:])
	tok = hex.EncodeToString(b[:])
	// O_EXCL: two processes starting on one data dir must not each write
	// a different secret.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return readTokenFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	_, werr := f.WriteString(tok + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return "", fmt.Errorf("write %s: %w", path, werr)
	}
	return tok, nil
}
