package terminal

import "fmt"

// state is where a session is in its life.
//
//	attached ──stream lost / detach──▶ detached ──reattach──▶ attached
//	attached ──second stream──▶ attached (the first is replaced)
//	attached, detached ──close / release / idle / shutdown / shell exit──▶ ending
//	ending ──shell reaped, exit sent──▶ ended
type state int

const (
	stateAttached state = iota + 1
	stateDetached
	stateEnding
	stateEnded
)

func (s state) String() string {
	switch s {
	case stateAttached:
		return "attached"
	case stateDetached:
		return "detached"
	case stateEnding:
		return "ending"
	case stateEnded:
		return "ended"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// transitions is every allowed move; anything else is a bug.
var transitions = map[state][]state{
	stateAttached: {stateAttached, stateDetached, stateEnding},
	stateDetached: {stateAttached, stateEnding},
	stateEnding:   {stateEnded},
	stateEnded:    nil,
}

func allowed(from, to state) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// endReason says how a session ended; it is the exit control's message and the log's.
type endReason string

const (
	reasonExited       endReason = "exited"              // the shell exited by itself
	reasonClosed       endReason = "closed"              // the client sent close
	reasonReleased     endReason = "allocation_released" // EndAllocation (stop, release)
	reasonIdle         endReason = "idle_timeout"        // nobody attached for DetachedTimeout
	reasonShutdown     endReason = "agent_shutdown"      // Server.Close
	reasonAttachFailed endReason = "attach_failed"       // the first stream died before ready
)
