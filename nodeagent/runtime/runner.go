package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Runner runs host commands (useradd, pkill, systemctl). Every command a driver runs
// goes through it, so what the runtime does to a host reads as a list of commands and
// tests can watch them while they still run for real.
type Runner interface {
	// Run runs name with args. err is non-nil only when the command could not be run or
	// did not finish in time; a command that ran and exited non-zero is a Result with
	// its exit code.
	Run(ctx context.Context, name string, args ...string) (Result, error)
}

// Result is how a command ended.
type Result struct {
	Exit   int
	Stdout []byte
	Stderr []byte
}

// Exec is the Runner that executes commands.
type Exec struct {
	// Timeout bounds one command (DefaultCommandTimeout when zero).
	Timeout time.Duration
}

// DefaultCommandTimeout bounds one host command.
const DefaultCommandTimeout = 2 * time.Minute

// commandEnv is the whole environment of a host command: the sbin directories for the
// user tools, and the C locale so the output parsed here does not depend on the host's.
var commandEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// maxOutput bounds what is kept of a command's stdout and stderr.
const maxOutput = 64 << 10

// Run implements Runner. A command, once started, is not cancelled with ctx: killing
// useradd or userdel half-way can leave the user database locked or half-written, so a
// command always gets its full timeout, and the caller checks ctx between commands.
func (e Exec) Run(ctx context.Context, name string, args ...string) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = DefaultCommandTimeout
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, name, args...)
	cmd.Env = commandEnv
	var stdout, stderr limitedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return res, nil
	case cctx.Err() != nil:
		return res, fmt.Errorf("%s: did not finish within %s", name, timeout)
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		res.Exit = exit.ExitCode()
		return res, nil
	default:
		return res, fmt.Errorf("%s: %w", name, err)
	}
}

// limitedBuffer keeps the first maxOutput bytes and drops the rest.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// run runs a command that must exit with one of ok (0 when none given) and returns its
// stdout; any other outcome is an error naming the command and its stderr.
func run(ctx context.Context, r Runner, ok []int, name string, args ...string) (Result, error) {
	res, err := r.Run(ctx, name, args...)
	if err != nil {
		return res, err
	}
	if len(ok) == 0 {
		ok = []int{0}
	}
	for _, c := range ok {
		if res.Exit == c {
			return res, nil
		}
	}
	return res, fmt.Errorf("%s %s: exit %d: %s", name, strings.Join(args, " "), res.Exit, strings.TrimSpace(string(res.Stderr)))
}
