// Package gpu is what the node agent knows about the host's GPUs: their inventory (UUID,
// model, memory, PCI bus id, MIG mode, driver and CUDA versions) and periodic telemetry
// samples (utilization, memory used, temperature, power, ECC counters, XID events).
//
// Every backend reads through go-nvml's nvml.Interface: "nvml" is the real library
// (libnvidia-ml.so, loaded at Init), and the "mock-*" backends are go-nvml's own DGX
// mock servers with the functions the mock leaves nil (utilization, temperature, power,
// ECC, events) filled in deterministically, so tests and `make dev` run the same code
// path as production.
//
// The package never changes GPU state (no MIG reconfiguration, no clocks, no resets);
// it only reads.
package gpu
