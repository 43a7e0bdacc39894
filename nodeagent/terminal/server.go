package terminal

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/termproto"
)

// DefaultDetachedTimeout is how long a session with nobody attached is kept.
const DefaultDetachedTimeout = 5 * time.Minute

// rememberEnded is how many ended session ids are remembered, so a late reattach is told
// the session ended instead of silently getting a fresh shell under the old id.
const rememberEnded = 1024

// Options configure a Server; zero values take the defaults.
type Options struct {
	// DetachedTimeout ends a session nobody has been attached to for this long
	// (agent config terminal_detached_timeout; default 5 minutes).
	DetachedTimeout time.Duration
	// MaxSessionsPerAllocation and MaxSessions bound live sessions (attached or not);
	// beyond them a new session is refused with too_many_sessions. Defaults 8 and 64.
	MaxSessionsPerAllocation int
	MaxSessions              int
	// Clock measures the detached timeout (tests advance a clock.Manual and call
	// ReapDetached).
	Clock  clock.Clock
	Logger *slog.Logger
}

// Server serves TERMINAL streams (it is the agent's Options.Streams) and owns every
// terminal session on the node. Run it for the detached-timeout sweep; Close (or the end
// of Run's context) ends every session.
type Server struct {
	envs  Environments
	o     Options
	clock clock.Clock
	log   *slog.Logger

	mu         sync.Mutex
	sessions   map[string]*session
	ended      map[string]struct{}
	endedOrder []string
	closed     bool
}

// New returns a Server that looks allocations up in envs.
func New(envs Environments, o Options) *Server {
	if o.DetachedTimeout <= 0 {
		o.DetachedTimeout = DefaultDetachedTimeout
	}
	if o.MaxSessionsPerAllocation <= 0 {
		o.MaxSessionsPerAllocation = DefaultMaxSessionsPerAllocation
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{envs: envs, o: o, clock: o.Clock, log: o.Logger, sessions: map[string]*session{}, ended: map[string]struct{}{}}
}

// ServeStream serves one stream the control plane opened (agent.StreamHandler): it
// answers the preamble, then bridges the stream to a new or existing session until the
// stream ends, detaches, closes the session, or the session ends. It closes st.
func (s *Server) ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn) {
	req, ref := parseRequest(pre)
	if ref != nil {
		s.refuse(st, pre, ref)
		return
	}
	env, ok := s.envs.Session(req.allocationID)
	if !ok {
		s.refuse(st, pre, refuse(CodeAllocationNotActive, "the allocation is not running on this node"))
		return
	}
	att := newAttachment(st)
	att.wmu.Lock() // output waits until the reply, ready and replay are written
	sess, fresh, replay, old, ref := s.open(req, env, att)
	if ref != nil {
		att.wmu.Unlock()
		s.refuse(st, pre, ref)
		return
	}
	if old != nil {
		go old.replaced()
	}
	cols, rows := sess.size()
	err := fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true})
	if err == nil {
		err = termproto.WriteControl(st, termproto.Control{Type: termproto.TypeReady, SessionID: sess.id, Cols: cols, Rows: rows, Replayed: !fresh})
	}
	if err == nil && !fresh {
		// The reset puts the client's terminal in a known state, so replayed output that
		// starts in the middle of an escape sequence cannot leave it confused.
		err = termproto.WriteData(st, append([]byte("\x1bc"), replay...))
	}
	att.wmu.Unlock()
	if err != nil {
		if fresh {
			sess.end(reasonAttachFailed) // nobody ever saw this shell
		}
		sess.lost(att)
		return
	}
	stop := context.AfterFunc(ctx, func() { sess.lost(att) })
	defer stop()
	sess.serve(att)
	<-att.done
}

func (s *Server) refuse(st net.Conn, pre *fabricv1.StreamPreamble, ref *refusal) {
	s.log.Info("terminal stream refused", "session_id", pre.GetStreamId(), "allocation_id", pre.GetAllocationId(), "code", ref.code)
	_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: ref.code, Message: ref.message})
	_ = st.Close()
}

// open attaches att to the request's session, starting it when it does not exist.
func (s *Server) open(req request, env SessionEnv, att *attachment) (sess *session, fresh bool, replay []byte, old *attachment, ref *refusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, nil, nil, refuse(CodeShuttingDown, "the node agent is stopping")
	}
	if existing := s.sessions[req.sessionID]; existing != nil {
		if existing.allocationID != req.allocationID {
			return nil, false, nil, nil, refuse(CodeSessionConflict, "the session id belongs to another allocation")
		}
		old, replay, ref = existing.reattach(att, req)
		return existing, false, replay, old, ref
	}
	if _, gone := s.ended[req.sessionID]; gone {
		return nil, false, nil, nil, refuse(CodeSessionEnded, "the terminal session has ended")
	}
	if len(s.sessions) >= s.o.MaxSessions {
		return nil, false, nil, nil, refuse(CodeTooManySessions, "this node has %d terminal sessions, the most it serves", s.o.MaxSessions)
	}
	n := 0
	for _, x := range s.sessions {
		if x.allocationID == req.allocationID {
			n++
		}
	}
	if n >= s.o.MaxSessionsPerAllocation {
		return nil, false, nil, nil, refuse(CodeTooManySessions, "the allocation has %d terminal sessions, the most allowed", s.o.MaxSessionsPerAllocation)
	}
	// The shell starts under the lock so two streams with one new session id cannot
	// both start one; a fork and exec take a millisecond or two.
	sess, err := s.start(req, env, att)
	if err != nil {
		s.log.Warn("terminal shell did not start", "session_id", req.sessionID, "allocation_id", req.allocationID, "error", err)
		return nil, false, nil, nil, refuse(CodeStartFailed, "the shell could not be started")
	}
	s.sessions[sess.id] = sess
	return sess, true, nil, nil, nil
}

// start runs the session's shell on a new PTY, attached to att.
func (s *Server) start(req request, env SessionEnv, att *attachment) (*session, error) {
	cmd, err := buildCommand(env, req.command, req.term)
	if err != nil {
		return nil, err
	}
	var owner *[2]uint32
	if env.RealUser {
		owner = &[2]uint32{env.UID, env.GID}
	}
	master, err := startPTY(cmd, req.cols, req.rows, owner)
	if err != nil {
		return nil, err
	}
	sess := &session{
		id: req.sessionID, allocationID: req.allocationID, user: env.User,
		srv: s, cmd: cmd, master: master, started: s.clock.Now(),
		st: stateAttached, att: att, ring: newRing(ReplayBytes), cols: req.cols, rows: req.rows,
		pumpDone: make(chan struct{}), done: make(chan struct{}),
	}
	go sess.pump()
	go sess.wait()
	s.log.Info("terminal session started", "session_id", sess.id, "allocation_id", sess.allocationID, "user", env.User,
		"pid", cmd.Process.Pid, "custom_command", len(req.command) > 0)
	return sess, nil
}

// remove forgets an ended session and remembers its id.
func (s *Server) remove(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[sess.id] == sess {
		delete(s.sessions, sess.id)
	}
	if _, ok := s.ended[sess.id]; !ok {
		s.ended[sess.id] = struct{}{}
		s.endedOrder = append(s.endedOrder, sess.id)
		if len(s.endedOrder) > rememberEnded {
			delete(s.ended, s.endedOrder[0])
			s.endedOrder = s.endedOrder[1:]
		}
	}
}

// EndAllocation ends every terminal session of an allocation: the attached clients get
// `exit` with code -1 and message "allocation_released", and the shells get SIGHUP
// (SIGKILL after a grace of a few seconds). It returns once they are gone, with how many
// there were. The runtime calls it when it stops or releases an allocation, after the
// allocation stopped being live for Environments (so no new session can start).
func (s *Server) EndAllocation(allocationID string) int {
	var list []*session
	s.mu.Lock()
	for _, x := range s.sessions {
		if x.allocationID == allocationID {
			list = append(list, x)
		}
	}
	s.mu.Unlock()
	return endAll(list, reasonReleased)
}

// ReapDetached ends the sessions nobody has been attached to for DetachedTimeout (by the
// injected clock) and returns how many it ended. Run calls it periodically.
func (s *Server) ReapDetached() int {
	now := s.clock.Now()
	var list []*session
	s.mu.Lock()
	for _, x := range s.sessions {
		x.mu.Lock()
		if x.st == stateDetached && now.Sub(x.detachedAt) >= s.o.DetachedTimeout {
			list = append(list, x)
		}
		x.mu.Unlock()
	}
	s.mu.Unlock()
	n := 0
	for _, x := range list {
		if x.end(reasonIdle) {
			n++
		}
	}
	return n
}

// Run sweeps detached sessions until ctx ends, then ends every session (Close).
func (s *Server) Run(ctx context.Context) error {
	every := min(max(s.o.DetachedTimeout/10, time.Second), 10*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.Close()
			return nil
		case <-t.C:
			s.ReapDetached()
		}
	}
}

// Close refuses new streams and ends every session (exit code -1, "agent_shutdown"),
// returning once the shells are gone.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	list := make([]*session, 0, len(s.sessions))
	for _, x := range s.sessions {
		list = append(list, x)
	}
	s.mu.Unlock()
	endAll(list, reasonShutdown)
}

// Len is the number of live sessions (attached, detached or ending).
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

func endAll(list []*session, reason endReason) int {
	for _, x := range list {
		x.end(reason)
	}
	for _, x := range list {
		<-x.done
	}
	return len(list)
}
