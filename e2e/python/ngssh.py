"""A connection client shaped like NeMo Gym's orchestration executor connections.

Written from the documented behaviour of
``nemo_gym.orchestration.executors.connection`` (shared/seeds and section 4.1
of shared/reference/wire-facts.md), not from its code, so that Tether's SSH
path is exercised exactly as NeMo Gym drives a node:

* ``SSHConnection(host)`` opens one master connection
  (``ssh -o ControlMaster=yes -o ControlPath=SOCK -o ControlPersist=yes -N HOST``)
  and waits up to ``MASTER_TIMEOUT`` seconds for its control socket;
* ``run(commands)`` joins the commands with newlines into one bash script and
  feeds it on stdin to ``ssh OPTS HOST bash -s`` through that socket: only the
  script's last status counts, stdout is returned as is;
* ``copy(local, remote)`` is ``ssh OPTS HOST mkdir -p REMOTE`` then
  ``rsync -az --delete -e "ssh OPTS" LOCAL/ HOST:REMOTE``, a mirror;
* a failure raises ``RuntimeError("Command failed (CONTEXT) with exit code N:\\n  ARGV\\nSTDERR")``.

The one addition: ``config`` (a file for ``ssh -F``), because these tests
must not edit the user's ~/.ssh/config, where a NeMo Gym user would put the
output of ``tether ssh-config``. With ``config=None`` the commands are
NeMo Gym's, option for option.
"""

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def checked(cmd, input=None, context=""):
    """Runs cmd (a list), returns its stdout; raises RuntimeError on a non-zero exit."""
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if proc.returncode != 0:
        where = f" ({context})" if context else ""
        raise RuntimeError(
            f"Command failed{where} with exit code {proc.returncode}:\n"
            f"  {' '.join(cmd)}\n{proc.stderr.strip()}"
        )
    return proc.stdout


class Connection:
    """What every connection offers: copy, run, close; a context manager."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self):
        pass

    def copy(self, local: Path, remote: Path) -> None:
        raise NotImplementedError

    def run(self, commands: list) -> str:
        raise NotImplementedError


class LocalConnection(Connection):
    """This machine: each command split and run without a shell, stopping at the first failure."""

    def copy(self, local: Path, remote: Path) -> None:
        remote = Path(remote)
        if remote.exists():
            shutil.rmtree(remote)
        shutil.copytree(local, remote)

    def run(self, commands: list) -> str:
        return "\n".join(checked(shlex.split(c)) for c in commands)


class SSHConnection(Connection):
    """One SSH master connection; every copy and run goes through its socket."""

    MASTER_TIMEOUT = 10  # seconds for the master's control socket to appear
    OPTS = ["-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes"]

    def __init__(self, hostname: str, config: str = None):
        self.hostname = hostname
        self._base = (["-F", config] if config else []) + self.OPTS
        self._dir = tempfile.mkdtemp(prefix="ngssh-")
        self._socket = os.path.join(self._dir, "master.sock")
        # The master goes to the background and keeps its stderr: a file,
        # not a pipe nobody reads once it is up.
        self._log = open(os.path.join(self._dir, "master.log"), "w+b")
        self._master = subprocess.Popen(
            ["ssh", *self._base, "-o", "ControlMaster=yes", "-o", f"ControlPath={self._socket}",
             "-o", "ControlPersist=yes", "-N", hostname],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
        )
        self._wait_for_socket()

    def _wait_for_socket(self):
        deadline = time.monotonic() + self.MASTER_TIMEOUT
        while not os.path.exists(self._socket):
            if self._master.poll() not in (None, 0):
                self._log.seek(0)
                err = self._log.read().decode(errors="replace").strip()
                self._log.close()
                shutil.rmtree(self._dir, ignore_errors=True)
                raise RuntimeError(f"ssh master to {self.hostname} exited with {self._master.returncode}: {err}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"ssh master to {self.hostname}: no control socket after {self.MASTER_TIMEOUT}s")
            time.sleep(0.05)

    def _ssh_opts(self):
        return [*self._base, "-o", "ControlMaster=no", "-o", f"ControlPath={self._socket}"]

    def run(self, commands: list) -> str:
        return checked(["ssh", *self._ssh_opts(), self.hostname, "bash", "-s"],
                       input="\n".join(commands), context=f"ssh commands on {self.hostname}")

    def copy(self, local: Path, remote: Path) -> None:
        checked(["ssh", *self._ssh_opts(), self.hostname, "mkdir", "-p", str(remote)],
                context=f"mkdir -p {self.hostname}:{remote}")
        checked(["rsync", "-az", "--delete", "-e", " ".join(["ssh", *self._ssh_opts()]),
                 f"{local}/", f"{self.hostname}:{remote}"],
                context=f"rsync to {self.hostname}:{remote}")

    def master_pid(self):
        """The running master's pid as ssh -O check reports it, or None."""
        proc = subprocess.run(["ssh", *self._ssh_opts(), "-O", "check", self.hostname],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return None
        text = proc.stderr + proc.stdout
        start = text.find("pid=")
        return int(text[start + 4:text.index(")", start)]) if start >= 0 else None

    def close(self):
        if self._master is None:
            return
        subprocess.run(["ssh", *self._ssh_opts(), "-O", "exit", self.hostname], capture_output=True)
        try:
            self._master.wait(timeout=self.MASTER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._master.kill()
            self._master.wait()
        self._log.close()
        self._master = None
        shutil.rmtree(self._dir, ignore_errors=True)


def get_connection(hostname, config=None) -> Connection:
    """LocalConnection for None or this machine's host name, else an SSHConnection."""
    if hostname is None or hostname == socket.gethostname():
        return LocalConnection()
    return SSHConnection(hostname, config)
