package terminal

import (
	"fmt"
	"regexp"
	"strings"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/google/uuid"
)

// Refusal codes the agent answers a TERMINAL preamble with (StreamReply.error_code).
const (
	CodeUnsupportedKind     = "unsupported_kind"      // not a TERMINAL stream
	CodeInvalidRequest      = "invalid_request"       // ids, size, TERM or command out of bounds
	CodeAllocationNotActive = "allocation_not_active" // unknown, stopped or released allocation
	CodeTooManySessions     = "too_many_sessions"     // per-allocation or per-agent limit reached
	CodeSessionConflict     = "session_conflict"      // the session id belongs to another allocation
	CodeSessionEnded        = "session_ended"         // the session id named a session that has ended
	CodeStartFailed         = "start_failed"          // the shell could not be started
	CodeShuttingDown        = "shutting_down"         // the agent is stopping
)

// Error codes of `error` control frames the agent sends on an accepted stream.
const (
	CodeSessionReplaced = "session_replaced" // another stream attached to this session
)

// Limits.
const (
	DefaultMaxSessionsPerAllocation = 8
	DefaultMaxSessions              = 64
	MaxDimension                    = 1000 // cols and rows are 1..MaxDimension
	DefaultCols, DefaultRows        = 80, 24
	DefaultTerm                     = "xterm-256color"
	maxTermLen                      = 64
	maxArgs                         = 64
	maxArgBytes                     = 4096
	maxCommandBytes                 = 16 << 10
)

// termPattern admits terminfo names (xterm-256color, screen.xterm-256color, vt100,
// rxvt-unicode) and nothing that could be an escape or a path.
var termPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// request is a checked TERMINAL preamble.
type request struct {
	sessionID    string
	allocationID string
	cols, rows   uint16
	sized        bool // the preamble carried a size (a reattach applies it)
	term         string
	command      []string
}

// refusal is a preamble the agent answers with ok=false.
type refusal struct{ code, message string }

func (r *refusal) Error() string { return r.code + ": " + r.message }

func refuse(code, format string, args ...any) *refusal {
	return &refusal{code: code, message: fmt.Sprintf(format, args...)}
}

// parseRequest checks a preamble against the limits; messages name the field, never
// echo the value.
func parseRequest(pre *fabricv1.StreamPreamble) (request, *refusal) {
	if pre.GetKind() != fabricv1.StreamKind_STREAM_KIND_TERMINAL {
		return request{}, refuse(CodeUnsupportedKind, "this handler serves terminal streams only")
	}
	r := request{cols: DefaultCols, rows: DefaultRows, term: DefaultTerm}
	var ok bool
	if r.sessionID, ok = canonicalUUID(pre.GetStreamId()); !ok {
		return request{}, refuse(CodeInvalidRequest, "stream_id must be a UUID")
	}
	if r.allocationID, ok = canonicalUUID(pre.GetAllocationId()); !ok {
		return request{}, refuse(CodeInvalidRequest, "allocation_id must be a UUID")
	}
	if sz := pre.GetTerminalSize(); sz != nil && (sz.GetCols() != 0 || sz.GetRows() != 0) {
		if !validDimension(sz.GetCols()) || !validDimension(sz.GetRows()) {
			return request{}, refuse(CodeInvalidRequest, "terminal_size cols and rows must be 1..%d", MaxDimension)
		}
		r.cols, r.rows, r.sized = uint16(sz.GetCols()), uint16(sz.GetRows()), true
	}
	if t := pre.GetTerm(); t != "" {
		if len(t) > maxTermLen || !termPattern.MatchString(t) {
			return request{}, refuse(CodeInvalidRequest, "term must be a terminfo name of at most %d characters", maxTermLen)
		}
		r.term = t
	}
	if cmd := pre.GetCommand(); len(cmd) > 0 {
		if len(cmd) > maxArgs {
			return request{}, refuse(CodeInvalidRequest, "command has more than %d arguments", maxArgs)
		}
		total := 0
		for _, a := range cmd {
			total += len(a)
			if len(a) > maxArgBytes || strings.ContainsRune(a, 0) {
				return request{}, refuse(CodeInvalidRequest, "command arguments must be at most %d bytes without NUL", maxArgBytes)
			}
		}
		if cmd[0] == "" || total > maxCommandBytes {
			return request{}, refuse(CodeInvalidRequest, "command must name a program and be at most %d bytes", maxCommandBytes)
		}
		r.command = cmd
	}
	return r, nil
}

func validDimension(v uint32) bool { return v >= 1 && v <= MaxDimension }

// canonicalUUID accepts only the 36-character form, so one session has one spelling.
func canonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", false
	}
	return u.String(), true
}
