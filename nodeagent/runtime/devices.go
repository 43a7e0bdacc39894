package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
)

// sharedNvidiaDevices are the devices every CUDA process needs besides its GPUs (the
// control device, unified memory, modeset), plus the MIG capability devices (read only;
// a capability is useless without its parent GPU's device) and the RDMA devices that
// multi-node training uses. Entries whose device does not exist on a host are ignored
// by systemd.
var sharedNvidiaDevices = []string{
	"/dev/nvidiactl rw",
	"/dev/nvidia-uvm rw",
	"/dev/nvidia-uvm-tools rw",
	"/dev/nvidia-modeset rw",
	"char-nvidia-caps r",
	"char-infiniband_verbs rw",
	"/dev/infiniband/rdma_cm rw",
	"/dev/fuse rw",
}

// deviceDropIn renders the slice drop-in for the user's slice. DevicePolicy=closed
// admits the standard pseudo devices (/dev/null, /dev/zero, /dev/full, /dev/random,
// /dev/urandom, /dev/tty, /dev/ptmx and the PTYs) and what DeviceAllow lists; every
// other device — other GPUs included — is denied by the kernel's device controller for
// every process in the slice, whatever CUDA_VISIBLE_DEVICES says.
func deviceDropIn(allocationID, user string, minors []int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by gantry-nodeagent for allocation %s (user %s); removed on release.\n", allocationID, user)
	b.WriteString("# Only this allocation's GPUs (and the NVIDIA control devices) are reachable from the user's sessions.\n")
	b.WriteString("[Slice]\nDevicePolicy=closed\n")
	for _, d := range sharedNvidiaDevices {
		b.WriteString("DeviceAllow=" + d + "\n")
	}
	for _, m := range minors {
		fmt.Fprintf(&b, "DeviceAllow=/dev/nvidia%d rw\n", m)
	}
	return []byte(b.String())
}

// deviceMinors returns each GPU's device minor (the N of /dev/nvidiaN) from the driver's
// <dir>/<pci bus id>/information. The minor is not the NVML index in general, so it is
// read, never guessed; a GPU whose minor cannot be read fails the provision (a policy
// admitting the wrong device would be worse than none).
func deviceMinors(dir string, gpus []gpu.GPU) ([]int, error) {
	out := make([]int, 0, len(gpus))
	for _, g := range gpus {
		bus := strings.ToLower(g.PCIBusID)
		// NVML says 00000000:18:00.0 (32-bit domain), the driver's directory 0000:18:00.0.
		if len(bus) == 16 {
			bus = bus[4:]
		}
		b, err := readFileLimited(filepath.Join(dir, bus, "information"), 64<<10)
		if err != nil {
			return nil, fmt.Errorf("device minor of gpu %s: %w", g.UUID, err)
		}
		minor := -1
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Device Minor" {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 && n < 256 {
					minor = n
				}
			}
		}
		if minor < 0 {
			return nil, fmt.Errorf("device minor of gpu %s: no \"Device Minor\" in %s", g.UUID, filepath.Join(dir, bus, "information"))
		}
		out = append(out, minor)
	}
	return out, nil
}

func (d *LinuxUser) systemdDir() string {
	if d.SystemdDir != "" {
		return d.SystemdDir
	}
	return "/etc/systemd/system"
}

func (d *LinuxUser) nvidiaDir() string {
	if d.NvidiaGPUsDir != "" {
		return d.NvidiaGPUsDir
	}
	return "/proc/driver/nvidia/gpus"
}

func sliceName(uid uint32) string { return "user-" + strconv.FormatUint(uint64(uid), 10) + ".slice" }

func (d *LinuxUser) dropInPath(uid uint32) string {
	return filepath.Join(d.systemdDir(), sliceName(uid)+".d", dropInName)
}

// applyDevicePolicy installs the user's slice drop-in when systemd runs the host and the
// NVIDIA driver is loaded, and returns the slice name ("" when no policy applies). The
// drop-in takes effect for sessions that start after the reload: at provision nothing of
// the user runs yet, and restart kills everything first.
func (d *LinuxUser) applyDevicePolicy(ctx context.Context, s Spec, u *passwdEntry) (string, error) {
	if !d.systemd() {
		return "", nil
	}
	if _, err := os.Stat(d.nvidiaDir()); errors.Is(err, fs.ErrNotExist) {
		d.logger().Warn("no NVIDIA driver loaded: no device policy for the allocation", "allocation_id", s.AllocationID)
		return "", nil
	}
	minors, err := deviceMinors(d.nvidiaDir(), s.GPUs)
	if err != nil {
		return "", err
	}
	want := deviceDropIn(s.AllocationID, s.User, minors)
	path := d.dropInPath(u.UID)
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		return sliceName(u.UID), nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	if err := atomicfile.Write(path, want, 0o644); err != nil {
		return "", err
	}
	if _, err := run(ctx, d.Runner, nil, "systemctl", "daemon-reload"); err != nil {
		return "", err
	}
	return sliceName(u.UID), nil
}

// removeDevicePolicy deletes the drop-in (and its directory when empty) and reloads.
func (d *LinuxUser) removeDevicePolicy(ctx context.Context, u *passwdEntry) error {
	path := d.dropInPath(u.UID)
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	_ = os.Remove(filepath.Dir(path)) // only succeeds when empty
	if !d.systemd() {
		return nil
	}
	_, err := run(ctx, d.Runner, nil, "systemctl", "daemon-reload")
	return err
}
