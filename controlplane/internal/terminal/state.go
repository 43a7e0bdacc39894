package terminal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal/terminaldb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Status is a terminal session's status.
type Status string

// Statuses. A session is created attached (its first WebSocket got session_ready),
// detaches when that WebSocket goes away without ending it, reattaches with a new token
// naming it, and ends once.
const (
	StatusAttached Status = "attached"
	StatusDetached Status = "detached"
	StatusEnded    Status = "ended"
)

// EndReason says how a session ended (terminal_sessions.ended_by, the end audit row).
type EndReason string

// End reasons.
const (
	EndExit               EndReason = "exit"                // the shell exited (exit code recorded)
	EndClientClosed       EndReason = "client_closed"       // the browser closed the WebSocket normally (1000)
	EndReleased           EndReason = "released"            // the allocation is being released
	EndAllocationInactive EndReason = "allocation_inactive" // the allocation stopped, restarted, failed or completed
	EndIdleTimeout        EndReason = "idle_timeout"        // nobody reattached within the detach grace
	EndAgentShutdown      EndReason = "agent_shutdown"      // the node agent stopped
	EndError              EndReason = "error"               // the agent reported an error ending the session
)

// event is what happens to a session.
type event string

const (
	evAttach event = "attach"
	evDetach event = "detach"
	evEnd    event = "end"
)

// transitions is the one table of allowed moves; "" is a session not created yet.
// Attaching an attached session is a takeover (a new WebSocket replaces one whose
// replica vanished before it could detach): the newest attachment wins.
var transitions = map[event]map[Status]Status{
	evAttach: {"": StatusAttached, StatusAttached: StatusAttached, StatusDetached: StatusAttached},
	evDetach: {StatusAttached: StatusDetached},
	evEnd:    {StatusAttached: StatusEnded, StatusDetached: StatusEnded},
}

// apply is the move of e from `from`, or ok=false when the table forbids it.
func apply(from Status, e event) (to Status, ok bool) {
	to, ok = transitions[e][from]
	return to, ok
}

// onlyDetached is End's att for "only while nobody is attached".
const onlyDetached int32 = -1

// errSessionGone is an attach to a session that ended meanwhile.
var errSessionGone = errors.New("terminal: session has ended")

// attach records that a WebSocket is attached to the grant's session (the agent said
// ready) and returns the attachment number the bridge holds. The first attachment
// creates the session and is audited as terminal.session.start; later ones as
// terminal.session.reattach.
func (s *Service) attach(ctx context.Context, g Grant, nodeID uuid.UUID, cols, rows int) (int32, error) {
	now := s.now()
	var att int32
	err := db.InTx(ctx, s.deps.Pool, func(tx pgx.Tx) error {
		q := terminaldb.New(tx)
		cur, err := q.LockSession(ctx, g.SessionID)
		from := Status(cur.Status)
		if errors.Is(err, pgx.ErrNoRows) {
			from = ""
		} else if err != nil {
			return fmt.Errorf("lock terminal session: %w", err)
		}
		if _, ok := apply(from, evAttach); !ok {
			return errSessionGone
		}
		action := "terminal.session.reattach"
		if from == "" {
			if g.Reattach {
				return errSessionGone
			}
			cur, err = q.InsertSession(ctx, terminaldb.InsertSessionParams{
				ID: g.SessionID, TenantID: g.TenantID, ProjectID: g.ProjectID, AllocationID: g.AllocationID,
				NodeID: nodeID, UserID: g.UserID, Cols: int32(cols), Rows: int32(rows), StartedAt: now,
			})
			if err != nil {
				return fmt.Errorf("insert terminal session: %w", err)
			}
			action = "terminal.session.start"
		} else {
			if cur.UserID != g.UserID || cur.AllocationID != g.AllocationID {
				return errSessionGone
			}
			cur, err = q.SetSessionState(ctx, terminaldb.SetSessionStateParams{
				ID: cur.ID, Status: string(StatusAttached), Attachment: cur.Attachment + 1, AttachedAt: now,
			})
			if err != nil {
				return fmt.Errorf("reattach terminal session: %w", err)
			}
		}
		att = cur.Attachment
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: action, TargetType: "terminal_session", TargetID: cur.ID.String(),
			TenantID: cur.TenantID, ProjectID: cur.ProjectID,
			Metadata: map[string]any{
				"allocation_id": cur.AllocationID.String(), "node_id": cur.NodeID.String(),
				"user_id": cur.UserID.String(), "attachment": cur.Attachment,
			},
		})
	})
	return att, err
}

// detach records that attachment att's WebSocket went away without ending the session;
// a later attachment (takeover) is left alone. Not audited: the session goes on.
func (s *Service) detach(ctx context.Context, sessionID uuid.UUID, att int32) error {
	now := s.now()
	return db.InTx(ctx, s.deps.Pool, func(tx pgx.Tx) error {
		q := terminaldb.New(tx)
		cur, err := q.LockSession(ctx, sessionID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock terminal session: %w", err)
		}
		to, ok := apply(Status(cur.Status), evDetach)
		if !ok || cur.Attachment != att {
			return nil
		}
		_, err = q.SetSessionState(ctx, terminaldb.SetSessionStateParams{
			ID: cur.ID, Status: string(to), Attachment: cur.Attachment, AttachedAt: cur.AttachedAt, DetachedAt: &now,
		})
		return err
	})
}

// End ends a session once and writes its terminal.session.end audit row (who,
// allocation, duration, how it ended, exit code). att > 0 ends it only while that
// attachment is the latest (a bridge replaced by a takeover does not end its
// successor's session); att 0 ends it whatever is attached; att < 0 (onlyDetached) ends
// it only while nobody is attached. Ending an ended session changes nothing and
// reports false.
func (s *Service) End(ctx context.Context, sessionID uuid.UUID, att int32, reason EndReason, exitCode *int) (bool, error) {
	now := s.now()
	ended := false
	err := db.InTx(ctx, s.deps.Pool, func(tx pgx.Tx) error {
		q := terminaldb.New(tx)
		cur, err := q.LockSession(ctx, sessionID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock terminal session: %w", err)
		}
		to, ok := apply(Status(cur.Status), evEnd)
		if !ok || (att > 0 && cur.Attachment != att) || (att < 0 && Status(cur.Status) != StatusDetached) {
			return nil
		}
		by := string(reason)
		code := pgtype.Int4{}
		if exitCode != nil {
			code = pgtype.Int4{Int32: int32(*exitCode), Valid: true}
		}
		endedAt := now
		if reason == EndIdleTimeout && cur.DetachedAt != nil {
			// The agent ended the PTY at the end of the grace, whenever the sweep runs.
			endedAt = cur.DetachedAt.Add(s.cfg.DetachGrace)
		}
		if _, err := q.SetSessionState(ctx, terminaldb.SetSessionStateParams{
			ID: cur.ID, Status: string(to), Attachment: cur.Attachment, AttachedAt: cur.AttachedAt,
			DetachedAt: cur.DetachedAt, EndedAt: &endedAt, EndedBy: &by, ExitCode: code,
		}); err != nil {
			return fmt.Errorf("end terminal session: %w", err)
		}
		meta := map[string]any{
			"allocation_id": cur.AllocationID.String(), "node_id": cur.NodeID.String(), "user_id": cur.UserID.String(),
			"ended_by": by, "duration_seconds": endedAt.Sub(cur.StartedAt).Round(time.Millisecond).Seconds(),
			"attachments": cur.Attachment,
		}
		if exitCode != nil {
			meta["exit_code"] = *exitCode
		}
		actx := ctx
		if reason != EndExit && reason != EndClientClosed {
			// The platform ended it, not the user: a system row (the user is in metadata).
			actx = principal.With(context.WithoutCancel(ctx), nil)
		}
		ended = true
		return s.audit.Record(actx, tx, audit.Entry{
			Action: "terminal.session.end", TargetType: "terminal_session", TargetID: cur.ID.String(),
			TenantID: cur.TenantID, ProjectID: cur.ProjectID, Metadata: meta,
		})
	})
	return ended, err
}

func (s *Service) expired(sess terminaldb.TerminalSession) bool {
	return sess.DetachedAt != nil && !s.now().Before(sess.DetachedAt.Add(s.cfg.DetachGrace))
}

// Sweep ends the sessions left detached past the grace (idle_timeout: the agent has
// ended their PTYs by now) and deletes tokens expired over a day ago. It returns how
// many sessions it ended.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	q := s.q(ctx)
	n := 0
	for {
		ids, err := q.ExpiredDetachedSessions(ctx, terminaldb.ExpiredDetachedSessionsParams{
			Before: s.now().Add(-s.cfg.DetachGrace), MaxRows: 100,
		})
		if err != nil {
			return n, fmt.Errorf("expired terminal sessions: %w", err)
		}
		for _, id := range ids {
			ended, err := s.End(ctx, id, onlyDetached, EndIdleTimeout, nil)
			if err != nil {
				return n, err
			}
			if ended {
				n++
			}
		}
		if len(ids) < 100 {
			break
		}
	}
	if _, err := q.PruneTokens(ctx, s.now().Add(-24*time.Hour)); err != nil {
		return n, fmt.Errorf("prune terminal tokens: %w", err)
	}
	return n, nil
}

// sessionGoneError is the client-facing error of an attach to an ended session.
func sessionGoneError() error {
	return apierr.New(apierr.InvalidRequest, "the terminal session has ended").With("reason", "session_ended").
		WithStatus(409)
}
