package runtime

import (
	"sort"
	"strings"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
)

// Environment variable names every process of an allocation gets.
const (
	EnvAllocationID = "GANTRY_ALLOCATION_ID"
	// EnvCUDAVisible and EnvNVIDIAVisible list the allocated GPUs by UUID ("GPU-…"), in
	// NVML index order. UUIDs rather than indices because CUDA numbers devices fastest
	// first unless told otherwise, so an index would name a different GPU than NVML's;
	// with UUIDs CUDA, nvidia-smi and the NVIDIA container toolkit agree on the set.
	EnvCUDAVisible   = "CUDA_VISIBLE_DEVICES"
	EnvNVIDIAVisible = "NVIDIA_VISIBLE_DEVICES"
	// EnvCUDAOrder makes CUDA number the visible GPUs in PCI bus order, the order
	// nvidia-smi prints, so device 0 inside the allocation is its lowest-index GPU.
	EnvCUDAOrder = "CUDA_DEVICE_ORDER"
)

// allocationEnv is the environment of an allocation's processes, as sorted KEY=VALUE.
// gpus is in NVML index order. An allocation without GPUs hides every GPU from CUDA
// (empty CUDA_VISIBLE_DEVICES) and from the container toolkit ("none").
func allocationEnv(allocationID, user, home, shell string, gpus []gpu.GPU) []string {
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	nvidia := strings.Join(uuids, ",")
	if nvidia == "" {
		nvidia = "none"
	}
	env := []string{
		EnvAllocationID + "=" + allocationID,
		EnvCUDAVisible + "=" + strings.Join(uuids, ","),
		EnvNVIDIAVisible + "=" + nvidia,
		EnvCUDAOrder + "=PCI_BUS_ID",
		"HOME=" + home,
		"USER=" + user,
		"LOGNAME=" + user,
		"SHELL=" + shell,
	}
	sort.Strings(env)
	return env
}

// envFile renders env as a file both sh (`. file`) and a line parser can read: one
// `export KEY='value'` per line, values single-quoted.
func envFile(env []string) []byte {
	var b strings.Builder
	b.WriteString("# Written by gantry-nodeagent for this allocation; rewritten on restart.\n")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		b.WriteString("export " + k + "=" + shellQuote(v) + "\n")
	}
	return []byte(b.String())
}

// shellQuote quotes s for sh: in single quotes, where a quote inside s closes the
// quoting, adds an escaped quote and reopens it.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// authorizedKeys renders an authorized_keys file: one key per line, in the given order.
func authorizedKeys(keys []string) []byte {
	var b strings.Builder
	b.WriteString("# Written by gantry-nodeagent from the allocation's SSH keys; rewritten on restart.\n")
	for _, k := range keys {
		b.WriteString(strings.TrimSpace(k) + "\n")
	}
	return []byte(b.String())
}
