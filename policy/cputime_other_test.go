//go:build !linux

package policy

// threadCPU is not measured off Linux.
func threadCPU() (int64, bool) { return 0, false }
