package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseConfig: any bytes as a config file of either role give a parsed
// file or an error naming the file, never a panic; a file that parses
// applies to a fresh command without error, and no value of a secret key
// written inline ever appears in an error.
func FuzzParseConfig(f *testing.F) {
	for _, name := range []string{"agent.yaml", "coordinator.yaml"} {
		if b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "deploy", "examples", name)); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"", "role: agent\n", "log:\n  level: debug\n", "token: {env: X}\n", "token: s3cr3tvalue\n",
		"coordinator: [a:1, b:2]\nexec-timeout: 30\n", "a: &x 1\nb: *x\n", "- 1\n", "{}", "nats: {password: s3cr3tvalue}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, r := range []*configRole{agentConfigRole, coordinatorConfigRole} {
			cmd, _ := r.newCmd(testEnv(nil))
			cf, err := parseConfig("f.yaml", data, cmd.Flags(), r)
			if err != nil {
				if !strings.HasPrefix(err.Error(), "f.yaml") {
					t.Fatalf("error does not start with the file: %v", err)
				}
				if strings.Contains(err.Error(), "s3cr3tvalue") {
					t.Fatalf("error shows an inline secret: %v", err)
				}
				continue
			}
			if _, err := cf.apply(cmd.Flags(), func(string) string { return "" }); err != nil {
				t.Fatalf("a parsed file does not apply: %v", err)
			}
		}
	})
}
