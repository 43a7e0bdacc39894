package terminal

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// Timeouts of a session's end. They are wall-clock bounds on waiting for the kernel and
// for a peer, not policy, so they do not use the injected clock.
const (
	// killGrace is how long a shell has to exit after SIGHUP before its process group
	// gets SIGKILL.
	killGrace = 3 * time.Second
	// drainTimeout is how long output the shell wrote before exiting may take to reach
	// the stream before the PTY is closed (a background job that keeps the terminal open
	// would otherwise keep the session forever).
	drainTimeout = 2 * time.Second
	// stuckWriteTimeout bounds a write to a client that stopped reading once the shell
	// has exited, so ending a session never waits on a peer.
	stuckWriteTimeout = 5 * time.Second
)

// session is one shell on one PTY, attached to at most one stream at a time.
type session struct {
	id           string
	allocationID string
	user         string
	srv          *Server
	cmd          *exec.Cmd
	master       *os.File
	started      time.Time

	// inMu makes one frame's input reach the PTY whole, even while a replacing stream
	// starts writing.
	inMu sync.Mutex

	mu         sync.Mutex
	st         state
	att        *attachment // nil while detached
	detachedAt time.Time
	ring       *ring
	cols, rows uint16
	reason     endReason
	killTimer  *time.Timer
	exitCode   int // valid once done is closed

	// readBytes counts output taken from the PTY, handledBytes the part of it already
	// written to a stream (or, with nobody attached, only to the ring). Their difference
	// is the output in flight inside the agent: at most one read buffer.
	readBytes    atomic.Int64
	handledBytes atomic.Int64

	pumpDone chan struct{}
	done     chan struct{}
}

// to moves the session to next; s.mu is held. A forbidden move is a bug: it is logged
// and refused rather than crashing the agent.
func (s *session) to(next state) bool {
	if !allowed(s.st, next) {
		s.srv.log.Error("terminal: forbidden session transition", "session_id", s.id, "from", s.st.String(), "to", next.String())
		return false
	}
	s.st = next
	return true
}

// pump passes PTY output to the attached stream, one read at a time: while a write to a
// slow stream blocks, the PTY is not read, its buffer fills and the shell blocks.
func (s *session) pump() {
	defer close(s.pumpDone)
	buf := make([]byte, termproto.MaxPayload)
	raw, rerr := s.master.SyscallConn()
	for {
		n, err := s.master.Read(buf)
		if n >= bulkRead && rerr == nil {
			n += readReady(raw, buf[n:])
		}
		if n > 0 {
			s.readBytes.Add(int64(n))
			s.mu.Lock()
			s.ring.Write(buf[:n])
			att := s.att
			s.mu.Unlock()
			if att != nil {
				if werr := att.writeData(buf[:n]); werr != nil {
					s.lost(att)
				}
			}
			s.handledBytes.Add(int64(n))
		}
		if err != nil {
			return // EIO once the shell and everything holding the terminal exited, or closed
		}
	}
}

// input writes one frame's keystrokes to the PTY, blocking while the shell does not
// read (the stream then stops being read and its window closes: nothing is dropped).
func (s *session) input(p []byte) error {
	s.inMu.Lock()
	defer s.inMu.Unlock()
	_, err := s.master.Write(p)
	return err
}

func (s *session) resize(cols, rows uint16) error {
	if err := setSize(s.master, cols, rows); err != nil {
		return err
	}
	s.mu.Lock()
	s.cols, s.rows = cols, rows
	s.mu.Unlock()
	return nil
}

// current reports whether att is the attached stream.
func (s *session) current(att *attachment) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.att == att
}

// lost detaches att (its stream ended, failed, or said detach) and closes it. The
// session stays for the detached timeout, counted from now.
func (s *session) lost(att *attachment) {
	s.mu.Lock()
	if s.att == att {
		s.att = nil
		if s.st == stateAttached && s.to(stateDetached) {
			s.detachedAt = s.srv.clock.Now()
		}
	}
	s.mu.Unlock()
	att.close()
}

// reattach makes att the attached stream and returns the one it replaces (if any) and
// the replay. The caller holds att.wmu, so live output queues behind the replay.
func (s *session) reattach(att *attachment, req request) (old *attachment, replay []byte, ref *refusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (s.st != stateAttached && s.st != stateDetached) || !s.to(stateAttached) {
		return nil, nil, refuse(CodeSessionEnded, "the terminal session has ended")
	}
	if req.sized && (req.cols != s.cols || req.rows != s.rows) {
		if err := setSize(s.master, req.cols, req.rows); err == nil {
			s.cols, s.rows = req.cols, req.rows
		}
	}
	old, s.att = s.att, att
	return old, s.ring.Bytes(), nil
}

func (s *session) size() (cols, rows uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cols, s.rows
}

// end asks the shell to exit (SIGHUP to its process group, as a hangup would; SIGKILL
// after killGrace). wait finishes the session once the shell is reaped. It reports
// false when the session was already ending.
func (s *session) end(reason endReason) bool {
	s.mu.Lock()
	if (s.st != stateAttached && s.st != stateDetached) || !s.to(stateEnding) {
		s.mu.Unlock()
		return false
	}
	s.reason = reason
	s.killTimer = time.AfterFunc(killGrace, func() { s.signal(syscall.SIGKILL) })
	s.mu.Unlock()
	s.signal(syscall.SIGHUP)
	return true
}

// signal signals the shell's process group (the shell leads its own session, so its
// pgid is its pid).
func (s *session) signal(sig syscall.Signal) {
	_ = syscall.Kill(-s.cmd.Process.Pid, sig)
}

// wait reaps the shell, lets its last output through, sends `exit` to the attached
// stream and drops the session.
func (s *session) wait() {
	err := s.cmd.Wait()
	code := exitStatus(s.cmd.ProcessState, err)
	s.mu.Lock()
	if s.killTimer != nil {
		s.killTimer.Stop()
	}
	if s.st == stateAttached || s.st == stateDetached {
		if s.to(stateEnding) {
			s.reason = reasonExited
		}
	}
	s.mu.Unlock()

	drained := time.NewTimer(drainTimeout)
	select {
	case <-s.pumpDone:
	case <-drained.C:
	}
	drained.Stop()
	_ = s.master.Close()
	select {
	case <-s.pumpDone:
	case <-time.After(stuckWriteTimeout):
		s.mu.Lock()
		if s.att != nil {
			s.att.unblock()
		}
		s.mu.Unlock()
		<-s.pumpDone
	}

	s.mu.Lock()
	reason := s.reason
	if reason != reasonExited {
		code = -1 // ended by the agent: there is no exit status to report
	}
	att := s.att
	s.att = nil
	s.exitCode = code
	s.to(stateEnded)
	s.mu.Unlock()
	// Gone from the server before the client hears of it: a reconnect after `exit` is
	// told session_ended, never handed the dying session.
	s.srv.remove(s)
	if att != nil {
		_ = att.conn.SetWriteDeadline(time.Now().Add(stuckWriteTimeout))
		c := code
		_ = att.writeControl(termproto.Control{Type: termproto.TypeExit, SessionID: s.id, Code: &c, Message: string(reason)})
		att.close()
	}
	s.srv.log.Info("terminal session ended", "session_id", s.id, "allocation_id", s.allocationID, "user", s.user,
		"reason", string(reason), "exit_code", code, "duration", s.srv.clock.Now().Sub(s.started).Round(time.Millisecond).String())
	close(s.done)
}

// exitStatus is the shell's exit status, 128+N when signal N killed it (the shells'
// own convention for $?).
func exitStatus(ps *os.ProcessState, err error) int {
	if ps == nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			ps = ee.ProcessState
		}
	}
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// bulkRead is a read size that means output is streaming rather than being typed.
const bulkRead = 1024

// readReady reads into buf what the PTY holds right now, without waiting. The kernel
// hands PTY output over in reads of at most 4 KiB; while a command streams output, what
// followed the first read is usually there already, and one 32 KiB frame instead of
// eight 4 KiB ones costs the tunnel, the control plane and the browser an eighth of the
// frames. Typed input's echo (a few bytes) never waits for this.
func readReady(raw syscall.RawConn, buf []byte) int {
	total := 0
	_ = raw.Read(func(fd uintptr) bool {
		for total < len(buf) {
			k, err := syscall.Read(int(fd), buf[total:])
			if k <= 0 || err != nil {
				break
			}
			total += k
		}
		return true // never wait for more
	})
	return total
}
