package sshd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/pkg/sftp"
)

// The sftp subsystem runs in a child process of the agent's own binary
// (/proc/self/exe, argv[1] sftpHelperArg, sftpHelperEnv=1), started with the
// login's credentials in its home directory, which serves SFTP (pkg/sftp)
// on its standard input and output while the session relays the channel to
// and from it. The kernel then checks every file operation against the
// login, as it does for sshd's sftp-server; the agent itself touches no
// file for it.

const (
	sftpHelperArg = "__tether-agent-sftp-helper"
	sftpHelperEnv = "TETHER_AGENT_SFTP_HELPER"
)

// The helper runs before main (and a test binary's TestMain), so that
// every binary linking this package can be its own sftp helper.
func init() {
	if len(os.Args) == 2 && os.Args[1] == sftpHelperArg && os.Getenv(sftpHelperEnv) == "1" {
		os.Exit(runSFTPHelper())
	}
}

// sftpCommand is the helper's command; the session adds the login's
// environment, credentials and home.
func sftpCommand() *exec.Cmd {
	cmd := exec.Command("/proc/self/exe", sftpHelperArg)
	cmd.Env = []string{sftpHelperEnv + "=1"}
	if v, ok := os.LookupEnv("GORACE"); ok {
		cmd.Env = append(cmd.Env, "GORACE="+v)
	}
	return cmd
}

// stdio is the helper's standard input and output as one stream.
type stdio struct{}

func (stdio) Read(p []byte) (int, error)  { return os.Stdin.Read(p) }
func (stdio) Write(p []byte) (int, error) { return os.Stdout.Write(p) }
func (stdio) Close() error                { return errors.Join(os.Stdin.Close(), os.Stdout.Close()) }

// runSFTPHelper is the helper's main; it returns its exit status: 0 when
// the client ended the session, 1 on an error (on standard error).
func runSFTPHelper() int {
	os.Unsetenv(sftpHelperEnv)
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	srv, err := sftp.NewServer(stdio{}, sftp.WithServerWorkingDirectory(wd))
	if err != nil {
		fmt.Fprintf(os.Stderr, "tether sftp: %v\n", err)
		return 1
	}
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(os.Stderr, "tether sftp: %v\n", err)
		return 1
	}
	return 0
}
