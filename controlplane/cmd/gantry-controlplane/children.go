package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// children runs the other Gantry programs that `make dev` starts beside the control plane
// (the log gateway, the node agent) as child processes. They are separate processes on
// purpose: each keeps its own memory limit and signal handling, exactly as under systemd.
// Their output goes to a log file under .dev/logs so the control plane's terminal stays
// readable.
type children struct {
	binDir string
	logDir string
	notef  func(string, ...any)
	wg     sync.WaitGroup
}

// sibling finds a program built next to this one (make build puts all of them in bin/).
func sibling(name string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found next to %s (run make build)", name, self)
	}
	return p, nil
}

// run executes name with args and extra environment once, to completion (e.g. `enroll`).
func (c *children) run(ctx context.Context, name string, env []string, args ...string) error {
	cmd, logf, err := c.command(ctx, name, env, args...)
	if err != nil {
		return err
	}
	defer logf.Close()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %v: %w (see %s)", name, args, err, logf.Name())
	}
	return nil
}

// start runs name in the background until ctx ends; then it gets SIGTERM and, after a
// grace period, SIGKILL. A child that exits early is reported, not restarted.
func (c *children) start(ctx context.Context, name string, env []string, args ...string) error {
	path, err := sibling(name)
	if err != nil {
		return err
	}
	return c.startAt(ctx, path, name, env, args...)
}

// startAt is start for a program outside bin/ (Prometheus, Alertmanager from the
// machine's packages), logging to name.log.
func (c *children) startAt(ctx context.Context, path, name string, env []string, args ...string) error {
	cmd, logf, err := c.commandAt(ctx, path, name, env, args...)
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer logf.Close()
		err := cmd.Wait()
		if ctx.Err() == nil {
			c.notef("%s exited: %v (see %s)", name, err, logf.Name())
		}
	}()
	return nil
}

func (c *children) command(ctx context.Context, name string, env []string, args ...string) (*exec.Cmd, *os.File, error) {
	path, err := sibling(name)
	if err != nil {
		return nil, nil, err
	}
	return c.commandAt(ctx, path, name, env, args...)
}

func (c *children) commandAt(ctx context.Context, path, name string, env []string, args ...string) (*exec.Cmd, *os.File, error) {
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return nil, nil, err
	}
	logf, err := os.OpenFile(filepath.Join(c.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a Ctrl-C in the terminal reaches the control plane, which then
	// stops the children in order (SIGTERM, then SIGKILL after WaitDelay).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return cmd, logf, nil
}

// wait blocks until every background child has exited.
func (c *children) wait() { c.wg.Wait() }

// waitHealthy polls url until it answers 200 or ctx ends.
func waitHealthy(ctx context.Context, url string) error {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
