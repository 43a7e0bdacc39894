package terminal

import (
	"os"
	"os/exec"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// startPTY starts cmd on a new PTY of the given size and returns the master side.
//
// The master is re-opened as a non-blocking, poller-registered *os.File: creack/pty's
// ioctls call Fd(), which turns a file into blocking mode, and a blocking read cannot be
// interrupted by Close. With the poller, closing the master wakes a reader or writer
// parked on it, so ending a session never waits on a shell (or a background job holding
// the terminal) that will not exit. Resize therefore goes through setSize, never
// pty.Setsize.
func startPTY(cmd *exec.Cmd, cols, rows uint16, owner *[2]uint32) (*os.File, error) {
	master, tty, err := pty.Open()
	if err != nil {
		return nil, err
	}
	defer tty.Close() // the child has its own copy after Start
	if err := pty.Setsize(master, &pty.Winsize{Cols: cols, Rows: rows}); err != nil {
		master.Close()
		return nil, err
	}
	if owner != nil && os.Geteuid() == 0 {
		// Like login(1): the terminal belongs to the user, so programs that reopen it by
		// name (tty, mesg, ssh's password prompt via /dev/pts/N) can.
		_ = os.Chown(tty.Name(), int(owner[0]), int(owner[1]))
		_ = os.Chmod(tty.Name(), 0o620)
	}
	fd, err := unix.FcntlInt(master.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	master.Close()
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	m := os.NewFile(uintptr(fd), "/dev/ptmx")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	if err := cmd.Start(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// setSize sets the window size (the kernel sends SIGWINCH to the foreground group).
func setSize(master *os.File, cols, rows uint16) error {
	return control(master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
}

// pendingOutput is how many bytes the shell has written that nobody has read from the
// master yet (tests use it to see a blocked writer).
func pendingOutput(master *os.File) (int, error) {
	var n int
	err := control(master, func(fd int) error {
		var err error
		n, err = unix.IoctlGetInt(fd, unix.TIOCINQ)
		return err
	})
	return n, err
}

func control(f *os.File, op func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) { opErr = op(int(fd)) }); err != nil {
		return err
	}
	return opErr
}
