//go:build !tetherclient

package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/filetype"
	"github.com/tetherfleet/tether/policy"
)

// maxPubKeyFile bounds a ~/.ssh/*.pub file tether dev reads, in bytes.
const maxPubKeyFile = 64 << 10

// devSSHNoKey is what tether dev says when the user has no SSH key.
const devSSHNoKey = `No SSH public key in ~/.ssh (*.pub): the SSH jump host is off. Create one with
  ssh-keygen -t ed25519
and restart tether dev; meanwhile "tether ssh-config --proxy-command" reaches
the node over NATS without a key.
`

// writeDevAuthorizedKeys collects the invoking user's public keys
// (~/.ssh/*.pub: plain keys; certificates are skipped, as the dev jump host
// has no user CA) into the authorized_keys file path (0600, its directory
// 0700), and returns their policy identities ("ssh-key:SHA256:…"), sorted.
// With no key it writes nothing and returns a note saying how to make one.
func writeDevAuthorizedKeys(path string, getenv func(string) string) (ids []string, note string, err error) {
	home := getenv("HOME")
	if home == "" {
		if home, err = os.UserHomeDir(); err != nil {
			return nil, devSSHNoKey, nil
		}
	}
	files, _ := filepath.Glob(filepath.Join(home, ".ssh", "*.pub"))
	slices.Sort(files)
	var out bytes.Buffer
	seen := map[string]bool{}
	for _, f := range files {
		data, err := readBounded(f, maxPubKeyFile)
		if err != nil {
			continue // unreadable or too large: not a key of ours
		}
		for len(bytes.TrimSpace(data)) > 0 {
			key, comment, _, rest, err := ssh.ParseAuthorizedKey(data)
			if err != nil {
				break
			}
			data = rest
			if _, ok := key.(*ssh.Certificate); ok {
				continue
			}
			id := "ssh-key:" + ssh.FingerprintSHA256(key)
			if seen[id] {
				continue
			}
			seen[id] = true
			ids = append(ids, id)
			line := bytes.TrimSpace(ssh.MarshalAuthorizedKey(key))
			out.Write(line)
			if comment = strings.TrimSpace(comment); comment != "" && !strings.ContainsAny(comment, "\r\n") {
				out.WriteString(" " + comment)
			}
			out.WriteString("\n")
		}
	}
	if len(ids) == 0 {
		return nil, devSSHNoKey, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, "", fmt.Errorf("ssh authorized keys: %w", err)
	}
	if err := writeFileAtomic(path, out.Bytes(), 0o600); err != nil {
		return nil, "", fmt.Errorf("ssh authorized keys %s: %w", path, err)
	}
	slices.Sort(ids)
	return ids, "", nil
}

// readBounded reads at most max bytes of path, failing when it is larger
// or not a regular file (opened without blocking: a FIFO would wait for a
// writer forever).
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file but %s", path, filetype.Of(fi.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: over %d bytes", path, max)
	}
	return b, nil
}

// devPolicySSHNote returns a note naming the keys the policy file at path
// grants no ssh to (a dev policy written before the keys, or edited), or ""
// when it grants each of them.
func devPolicySSHNote(path string, keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	p, err := policy.Parse(path, data)
	if err != nil {
		return ""
	}
	node := policy.Node{ID: devNodeID(), Labels: map[string]string{"dev": "true"}}
	var missing []string
	for _, k := range keys {
		id := policy.Identity{Kind: policy.KindSSHKey, Name: strings.TrimPrefix(k, "ssh-key:")}
		if _, err := p.Grants(id, policy.OpSSH, node); err != nil {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("The policy %s grants your SSH key(s) no ssh through the jump host:\n  %s\nadd them (see README \"SSH\"), or delete the file and restart tether dev to regenerate it.\n",
		path, strings.Join(missing, "\n  "))
}
