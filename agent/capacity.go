package agent

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// gpuQueryTimeout bounds the nvidia-smi query.
const gpuQueryTimeout = 5 * time.Second

// DetectCapacity measures the node: logical CPUs (runtime.NumCPU), MemTotal
// from /proc/meminfo, and the GPUs nvidia-smi lists when it is on PATH (the
// query is bounded by 5 s; no nvidia-smi or a failed query means 0 GPUs).
// It blocks at most until the query ends or ctx is done.
func DetectCapacity(ctx context.Context) protocol.Capacity {
	c := protocol.Capacity{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		c.MemoryBytes = parseMemTotal(b)
	}
	c.GPUs, c.GPUModel = detectGPUs(ctx)
	return c
}

// parseMemTotal returns MemTotal from /proc/meminfo contents, in bytes, or 0.
func parseMemTotal(b []byte) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "MemTotal:" {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0
		}
		if len(f) >= 3 && strings.EqualFold(f[2], "kB") {
			n *= 1024
		}
		return n
	}
	return 0
}

// detectGPUs asks nvidia-smi for the GPUs' names.
func detectGPUs(ctx context.Context) (int, string) {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return 0, ""
	}
	ctx, cancel := context.WithTimeout(ctx, gpuQueryTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--query-gpu=name", "--format=csv,noheader")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return 0, ""
	}
	return parseGPUNames(out)
}

// parseGPUNames counts the non-empty lines of nvidia-smi's output and returns
// the first name.
func parseGPUNames(out []byte) (int, string) {
	n, model := 0, ""
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if n == 0 {
			model = line
		}
		n++
	}
	return n, model
}
