package terminal

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal/terminaldb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// tokenBytes is the token's entropy; its text is the unpadded base64url of these bytes,
// which is also a valid WebSocket subprotocol token.
const tokenBytes = 32

var tokenEncoding = base64.RawURLEncoding

// tokenLen is the length of a token's text.
var tokenLen = tokenEncoding.EncodedLen(tokenBytes)

// Terminal sizes accepted from clients.
const (
	minSize, maxSize         = 1, 1000
	defaultCols, defaultRows = 80, 24
)

// MintRequest is what a caller asks for.
type MintRequest struct {
	// SessionID, when set, reattaches to that detached session.
	SessionID uuid.NullUUID
	// Cols and Rows are the initial size (0: the default, or the session's on reattach).
	Cols, Rows int
}

// Minted is a new token. Token is the secret; it is shown once and stored only hashed.
type Minted struct {
	Token     string
	SessionID uuid.UUID
	Reattach  bool
	ExpiresAt time.Time
}

// Grant is a consumed token: who may open which session of which allocation.
type Grant struct {
	UserID       uuid.UUID
	TenantID     uuid.UUID
	ProjectID    uuid.UUID
	AllocationID uuid.UUID
	SessionID    uuid.UUID
	Reattach     bool
	Cols, Rows   int
}

func hashToken(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return h[:]
}

func newToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return tokenEncoding.EncodeToString(b), nil
}

// wellFormed reports whether tok could be a token (length and alphabet), so garbage
// never reaches the database.
func wellFormed(tok string) bool {
	if len(tok) != tokenLen {
		return false
	}
	_, err := tokenEncoding.DecodeString(tok)
	return err == nil
}

// Mint issues a single-use token for the caller to open a terminal into the allocation:
// the allocation must be the project's (allocation_not_found), the caller at least a
// member (insufficient_permissions) and the allocation running (allocation_not_active).
// A reattach names one of the caller's own live sessions of this allocation.
func (s *Service) Mint(ctx context.Context, p *principal.Principal, proj projectctx.Project, allocationID uuid.UUID, req MintRequest) (Minted, error) {
	a, err := s.deps.Allocations.Allocation(ctx, proj.ID, allocationID)
	if err != nil {
		return Minted{}, err
	}
	if !proj.AtLeast(projectctx.RoleMember) {
		return Minted{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot open terminals in this project").
			With("required_role", projectctx.RoleMember)
	}
	if !running(a.Status) {
		return Minted{}, apierr.New(apierr.AllocationNotActive, "a terminal needs a running allocation; this one is %s", a.Status).
			With("status", a.Status)
	}
	for _, v := range []int{req.Cols, req.Rows} {
		if v != 0 && (v < minSize || v > maxSize) {
			return Minted{}, apierr.Validation("cols", "cols and rows must be between %d and %d", minSize, maxSize)
		}
	}
	sessionID, reattach := s.deps.IDs.New(), false
	cols, rows := orDefault(req.Cols, defaultCols), orDefault(req.Rows, defaultRows)
	if req.SessionID.Valid {
		sess, err := s.reattachable(ctx, p.UserID, allocationID, req.SessionID.UUID)
		if err != nil {
			return Minted{}, err
		}
		sessionID, reattach = sess.ID, true
		cols, rows = orDefault(req.Cols, int(sess.Cols)), orDefault(req.Rows, int(sess.Rows))
	}
	tok, err := newToken()
	if err != nil {
		return Minted{}, fmt.Errorf("terminal token: %w", err)
	}
	now := s.now()
	m := Minted{Token: tok, SessionID: sessionID, Reattach: reattach, ExpiresAt: now.Add(s.cfg.TokenTTL)}
	err = s.q(ctx).InsertToken(ctx, terminaldb.InsertTokenParams{
		ID: s.deps.IDs.New(), TokenHash: hashToken(tok), UserID: p.UserID, TenantID: a.TenantID, ProjectID: a.ProjectID,
		AllocationID: a.ID, SessionID: sessionID, Reattach: reattach, Cols: int32(cols), Rows: int32(rows),
		CreatedAt: now, ExpiresAt: m.ExpiresAt,
	})
	if err != nil {
		return Minted{}, fmt.Errorf("store terminal token: %w", err)
	}
	return m, nil
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// reattachable is the caller's live session of the allocation, or validation_error
// (reason session_not_found) without saying whether it exists for someone else. A
// session detached past the grace is ended here (idle_timeout) rather than offered.
func (s *Service) reattachable(ctx context.Context, userID, allocationID, sessionID uuid.UUID) (terminaldb.TerminalSession, error) {
	notFound := func() error {
		return apierr.Validation("session_id", "there is no session of yours to reattach to with this id").
			With("reason", "session_not_found")
	}
	sess, err := s.q(ctx).GetSession(ctx, sessionID)
	if errors.Is(err, pgx.ErrNoRows) {
		return sess, notFound()
	}
	if err != nil {
		return sess, fmt.Errorf("load terminal session: %w", err)
	}
	if sess.UserID != userID || sess.AllocationID != allocationID || sess.Status == string(StatusEnded) {
		return sess, notFound()
	}
	if sess.Status == string(StatusDetached) && s.expired(sess) {
		if _, err := s.End(context.WithoutCancel(ctx), sess.ID, onlyDetached, EndIdleTimeout, nil); err != nil {
			return sess, err
		}
		return sess, notFound()
	}
	return sess, nil
}

// Consume spends a token presented for allocationID: exactly one of any number of
// concurrent consumes of a token succeeds. The others, and every later one, are
// token_invalid and counted as replays; an unused token past its expiry is
// token_expired; a token of another allocation is spent and token_invalid. A refusal
// of a token this service issued says whose it was (tokenOwned), for the audit.
func (s *Service) Consume(ctx context.Context, tok string, allocationID uuid.UUID) (Grant, error) {
	invalid := func() error { return apierr.New(apierr.TokenInvalid, "terminal token is not valid") }
	if !wellFormed(tok) {
		return Grant{}, invalid()
	}
	hash := hashToken(tok)
	q := s.q(ctx)
	row, err := q.ConsumeToken(ctx, terminaldb.ConsumeTokenParams{Now: s.now(), TokenHash: hash})
	if errors.Is(err, pgx.ErrNoRows) {
		st, serr := q.TokenState(ctx, hash)
		switch {
		case errors.Is(serr, pgx.ErrNoRows):
			return Grant{}, invalid()
		case serr != nil:
			return Grant{}, fmt.Errorf("terminal token state: %w", serr)
		case st.ConsumedAt != nil:
			s.metrics.replayRejected.Inc()
			s.deps.Log.WarnContext(ctx, "terminal: replayed token refused", "allocation_id", allocationID)
			return Grant{}, &tokenOwned{err: invalid(), user: st.UserID, tenant: st.TenantID, projectID: st.ProjectID}
		default:
			return Grant{}, &tokenOwned{err: apierr.New(apierr.TokenExpired, "terminal token has expired; mint a new one"),
				user: st.UserID, tenant: st.TenantID, projectID: st.ProjectID}
		}
	}
	if err != nil {
		return Grant{}, fmt.Errorf("consume terminal token: %w", err)
	}
	if row.AllocationID != allocationID {
		s.deps.Log.WarnContext(ctx, "terminal: token presented for another allocation (spent)", "allocation_id", allocationID)
		return Grant{}, &tokenOwned{err: invalid(), user: row.UserID, tenant: row.TenantID, projectID: row.ProjectID}
	}
	s.metrics.consumedOK.Inc()
	return Grant{
		UserID: row.UserID, TenantID: row.TenantID, ProjectID: row.ProjectID, AllocationID: row.AllocationID,
		SessionID: row.SessionID, Reattach: row.Reattach, Cols: int(row.Cols), Rows: int(row.Rows),
	}, nil
}

// burn spends a token that travelled where it must not (a URL), if it is one.
func (s *Service) burn(ctx context.Context, tok string) {
	if !wellFormed(tok) {
		return
	}
	if err := s.q(ctx).BurnToken(ctx, terminaldb.BurnTokenParams{Now: s.now(), TokenHash: hashToken(tok)}); err != nil {
		s.deps.Log.WarnContext(ctx, "terminal: spending a leaked token failed", "err", err)
	}
}
