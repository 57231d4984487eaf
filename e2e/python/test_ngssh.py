"""NeMo Gym's SSH executor semantics against a Tether node, through tether ssh-config.

Run by the Go end-to-end test TestSSHNeMoGymPython, which starts the fleet
and passes it in the environment:

  TETHER_SSH_CONFIG  the ssh -F file tether ssh-config printed
  TETHER_SSH_HOST    the node's SSH host alias (node-a.tether)
  TETHER_SSH_SCRATCH a directory on the node (the node runs on this machine)

Standard library only (unittest), so python3 alone runs it.
"""

import hashlib
import os
import socket
import stat
import unittest
from pathlib import Path

import ngssh

CONFIG = os.environ.get("TETHER_SSH_CONFIG")
HOST = os.environ.get("TETHER_SSH_HOST")
SCRATCH = os.environ.get("TETHER_SSH_SCRATCH")


def tree(root: Path) -> dict:
    """Relative path -> (mode, sha256 of a file's bytes) for everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
            out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), stat.S_IFMT(st.st_mode), digest)
    return out


@unittest.skipUnless(CONFIG and HOST and SCRATCH, "run by the Go e2e test TestSSHNeMoGymPython")
class NeMoGymSSHConnection(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conn = ngssh.get_connection(HOST, CONFIG)
        cls.scratch = Path(SCRATCH)

    @classmethod
    def tearDownClass(cls):
        cls.conn.close()

    def test_alias_is_not_the_local_host(self):
        # get_connection takes the local host name for this machine.
        self.assertNotEqual(HOST, socket.gethostname())
        self.assertIsInstance(self.conn, ngssh.SSHConnection)
        self.assertIsInstance(ngssh.get_connection(None), ngssh.LocalConnection)
        self.assertIsInstance(ngssh.get_connection(socket.gethostname()), ngssh.LocalConnection)

    def test_run_last_status_counts(self):
        # NG-2: a failing line does not stop the script; its last status is 0.
        self.assertEqual(self.conn.run(["false", "echo a"]), "a\n")
        # NG-1: the last line fails: the error names the context and argv.
        with self.assertRaises(RuntimeError) as cm:
            self.conn.run(["echo a", "false"])
        msg = str(cm.exception)
        self.assertTrue(msg.startswith(f"Command failed (ssh commands on {HOST}) with exit code 1:\n  ssh "), msg)
        self.assertIn(f"-o ControlMaster=no -o ControlPath=", msg)
        self.assertTrue(msg.split("\n")[1].endswith(f" {HOST} bash -s"), msg)

    def test_run_is_one_script(self):
        # Shell state and syntax carry across lines; stdout is byte for byte.
        out = self.conn.run(["X=41", "X=$((X+1))", "test -e /nonexistent || echo \"__GYM_MISSING:/nonexistent\"",
                             "printf '%s' \"$X\""])
        self.assertEqual(out, "__GYM_MISSING:/nonexistent\n42")
        missing = [l[len("__GYM_MISSING:"):] for l in out.splitlines() if l.startswith("__GYM_MISSING:")]
        self.assertEqual(missing, ["/nonexistent"])

    def test_many_runs_share_the_master(self):
        pid = self.conn.master_pid()
        self.assertIsNotNone(pid, "ssh -O check finds no master")
        for i in range(20):
            self.assertEqual(self.conn.run([f"echo run-{i}"]), f"run-{i}\n")
        self.assertEqual(self.conn.master_pid(), pid, "the master changed during the runs")

    def test_copy_mirrors_and_deletes(self):
        local = self.scratch / "local"
        (local / "sub dir").mkdir(parents=True)
        (local / "sub dir" / "a file").write_text("a\n")
        (local / "data.bin").write_bytes(os.urandom(1 << 20))
        script = local / "job.sh"
        script.write_text("#!/bin/sh\necho job\n")
        script.chmod(0o755)
        remote = self.scratch / "remote" / "gym-job-20260101_000000"
        self.conn.copy(local, remote)  # mkdir -p makes the parents
        self.assertEqual(tree(remote), tree(local))
        # NG-3: an extra remote file goes; a changed local file follows
        # (another size: rsync's quick check skips a file of the same size
        # and modification time, whatever its bytes).
        (remote / "extra").write_text("stale\n")
        (local / "data.bin").write_bytes(os.urandom((1 << 20) + 1))
        self.conn.copy(local, remote)
        self.assertEqual(tree(remote), tree(local))
        # The copied script runs there, as the Slurm executor's sbatch would.
        self.assertEqual(self.conn.run([f"'{remote}/job.sh'"]), "job\n")

    def test_copy_failure_names_rsync(self):
        with self.assertRaises(RuntimeError) as cm:
            self.conn.copy(self.scratch / "no-such-dir", self.scratch / "dst-of-missing")
        self.assertIn(f"(rsync to {HOST}:", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
