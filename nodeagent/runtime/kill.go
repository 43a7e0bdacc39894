package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// pollInterval is how often a stop checks whether the processes it signalled are gone.
const pollInterval = 50 * time.Millisecond

// killRounds bounds the SIGKILL rounds (about 5 s): a process forked between the scan
// and the signal is caught by the next round, and one in uninterruptible sleep gets time
// to die before the stop is reported as failed.
const killRounds = 100

// escalate sends SIGTERM to what find returns, waits up to grace for it to be empty,
// then sends SIGKILL until it is (a bounded number of rounds). grace 0 goes straight to
// SIGKILL.
func escalate(ctx context.Context, grace time.Duration, find func() ([]int, error)) error {
	// Each signal goes to the processes found at that moment: one forked since the last
	// scan is signalled too.
	signal := func(sig syscall.Signal) error {
		pids, err := find()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("signal %d to pid %d: %w", sig, pid, err)
			}
		}
		return nil
	}
	pids, err := find()
	if err != nil || len(pids) == 0 {
		return err
	}
	if grace > 0 {
		if err := signal(syscall.SIGTERM); err != nil {
			return err
		}
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
		tick := time.NewTicker(pollInterval)
		defer tick.Stop()
	wait:
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline.C:
				break wait
			case <-tick.C:
				if pids, err = find(); err != nil || len(pids) == 0 {
					return err
				}
			}
		}
	}
	for range killRounds {
		if err := signal(syscall.SIGKILL); err != nil {
			return err
		}
		time.Sleep(pollInterval)
		if pids, err = find(); err != nil || len(pids) == 0 {
			return err
		}
	}
	return fmt.Errorf("%d process(es) still alive after SIGKILL: %v", len(pids), pids)
}

// killTagged ends the processes whose environment says GANTRY_ALLOCATION_ID=id (every
// process of an allocation under the Process driver, and its children unless they
// cleared their environment).
func killTagged(ctx context.Context, procDir, id string, grace time.Duration) error {
	find := func() ([]int, error) { return taggedPIDs(procDir, id) }
	return escalate(ctx, grace, find)
}

// taggedPIDs scans procDir/<pid>/environ. Processes whose environment cannot be read
// (another user's, or gone meanwhile) are skipped; a zombie's environment reads empty,
// so a killed child that nobody has reaped yet does not count as alive.
func taggedPIDs(procDir, id string) ([]int, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	tag := []byte(EnvAllocationID + "=" + id)
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "environ"))
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(b, []byte{0}) {
			if bytes.Equal(kv, tag) {
				out = append(out, pid)
				break
			}
		}
	}
	return out, nil
}

// killUID ends every process whose real, effective, saved or filesystem uid is uid
// (a setuid program the user started counts too).
func killUID(ctx context.Context, procDir string, uid uint32, grace time.Duration) error {
	find := func() ([]int, error) { return uidPIDs(procDir, uid) }
	return escalate(ctx, grace, find)
}

// uidPIDs scans procDir/<pid>/status for the Uid line. Zombies (state Z) are skipped:
// they are dead and only wait for their parent to reap them.
func uidPIDs(procDir string, uid uint32) ([]int, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	want := strconv.FormatUint(uint64(uid), 10)
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "status"))
		if err != nil {
			continue
		}
		match, zombie := false, false
		for line := range bytes.Lines(b) {
			switch {
			case bytes.HasPrefix(line, []byte("State:")):
				zombie = bytes.Contains(line, []byte("Z (zombie)"))
			case bytes.HasPrefix(line, []byte("Uid:")):
				for _, f := range bytes.Fields(line[len("Uid:"):]) {
					if string(f) == want {
						match = true
					}
				}
			}
		}
		if match && !zombie {
			out = append(out, pid)
		}
	}
	return out, nil
}
