package pgcluster

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Freeze stops the server and every process of it (SIGSTOP), for fault tests: the
// kernel still accepts connections and buffers what clients send, and nothing answers,
// the way a hung host behaves. The postmaster is stopped first, so that it forks
// nothing meanwhile; the backends lead process groups of their own, so each is
// signalled by pid. Thaw undoes it (Stop thaws first).
func (c *Cluster) Freeze() error {
	c.freezeMu.Lock()
	defer c.freezeMu.Unlock()
	pm := c.cmd.Process.Pid
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgcluster: freeze: %w", err)
	}
	c.frozen = append(c.frozen, pm)
	children, err := childrenOf(pm)
	if err != nil {
		return err
	}
	for _, pid := range children {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
			c.frozen = append(c.frozen, pid)
		}
	}
	return nil
}

// Thaw continues every process Freeze stopped (the backends first). Safe to call when
// nothing is frozen.
func (c *Cluster) Thaw() {
	c.freezeMu.Lock()
	defer c.freezeMu.Unlock()
	for i := len(c.frozen) - 1; i >= 0; i-- {
		_ = syscall.Kill(c.frozen[i], syscall.SIGCONT)
	}
	c.frozen = nil
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}
