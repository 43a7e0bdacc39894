package nodes

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// enrollmentPrefix starts every one-time enrollment token: "gne_" + 43 chars base64url of
// 32 random bytes. Only its SHA-256 is stored.
const enrollmentPrefix = "gne_"

// Revoke reasons of node_tokens.
const (
	revokedRotated    = "rotated"
	revokedByAdmin    = "revoked"
	revokedReenrolled = "reenrolled"
)

// EnrollmentToken is a freshly issued one-time token (the only time it is visible).
type EnrollmentToken struct {
	NodeID    uuid.UUID
	Token     string
	ExpiresAt time.Time
}

// IssueEnrollmentToken mints a one-time enrollment token for the node, valid for
// Config.EnrollmentTokenTTL. Earlier unused tokens of the node stop working: the newest
// token is the only one an operator can be holding on purpose.
func (s *Service) IssueEnrollmentToken(ctx context.Context, nodeID uuid.UUID) (EnrollmentToken, error) {
	var secret [32]byte
	if _, err := io.ReadFull(s.Rand, secret[:]); err != nil {
		return EnrollmentToken{}, fmt.Errorf("enrollment token random: %w", err)
	}
	tok := enrollmentPrefix + base64.RawURLEncoding.EncodeToString(secret[:])
	now := s.now()
	out := EnrollmentToken{NodeID: nodeID, Token: tok, ExpiresAt: now.Add(s.Config.EnrollmentTokenTTL)}
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		if _, err := lockNode(ctx, q, nodeID); err != nil {
			return err
		}
		superseded, err := q.ExpireEnrollmentTokens(ctx, nodesdb.ExpireEnrollmentTokensParams{NodeID: nodeID, ExpiresAt: now})
		if err != nil {
			return fmt.Errorf("expire enrollment tokens: %w", err)
		}
		if _, err := q.InsertEnrollmentToken(ctx, nodesdb.InsertEnrollmentTokenParams{
			ID: s.IDs.New(), NodeID: nodeID, TokenHash: enrollmentHash(tok), CreatedAt: now, ExpiresAt: out.ExpiresAt,
		}); err != nil {
			return fmt.Errorf("insert enrollment token: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.enrollment_token.create", TargetType: "node", TargetID: nodeID.String(),
			Metadata: map[string]any{"expires_at": out.ExpiresAt.Format(time.RFC3339), "superseded": superseded},
		})
	})
	if err != nil {
		return EnrollmentToken{}, err
	}
	return out, nil
}

func enrollmentHash(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return h[:]
}

// Enrollment is what a node receives when it enrolls (the node token only this once).
type Enrollment struct {
	NodeID     uuid.UUID
	NodeToken  string
	FabricCA   []byte
	FabricAddr string
}

// Enroll trades a one-time enrollment token for the node's long-lived bearer token. Of
// concurrent uses of one token exactly one succeeds. Enrolling a node that was enrolled
// before (host reinstalled) revokes its previous token and ends its tunnel.
func (s *Service) Enroll(ctx context.Context, enrollmentToken, hostname, agentVersion string) (Enrollment, error) {
	invalid := apierr.New(apierr.TokenInvalid, "enrollment token is not valid")
	if !strings.HasPrefix(enrollmentToken, enrollmentPrefix) || len(enrollmentToken) != len(enrollmentPrefix)+43 {
		return Enrollment{}, invalid
	}
	hash := enrollmentHash(enrollmentToken)
	now := s.now()
	var out Enrollment
	var reenrolled bool
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		et, err := q.ConsumeEnrollmentToken(ctx, nodesdb.ConsumeEnrollmentTokenParams{TokenHash: hash, UsedAt: &now})
		if errors.Is(err, pgx.ErrNoRows) {
			old, lerr := q.EnrollmentTokenByHash(ctx, hash)
			if lerr == nil && old.UsedAt == nil && !old.ExpiresAt.After(now) {
				return apierr.New(apierr.TokenExpired, "enrollment token has expired; issue a new one")
			}
			return invalid
		}
		if err != nil {
			return fmt.Errorf("consume enrollment token: %w", err)
		}
		out.NodeID = et.NodeID
		if _, err := lockNode(ctx, q, et.NodeID); err != nil {
			return err
		}
		n, err := q.RevokeNodeTokens(ctx, nodesdb.RevokeNodeTokensParams{NodeID: et.NodeID, RevokedAt: &now, RevokeReason: ptr(revokedReenrolled)})
		if err != nil {
			return fmt.Errorf("revoke node tokens: %w", err)
		}
		reenrolled = n > 0
		if out.NodeToken, err = s.insertNodeToken(ctx, q, et.NodeID, now); err != nil {
			return err
		}
		if err := q.MarkEnrolled(ctx, nodesdb.MarkEnrolledParams{
			ID: et.NodeID, EnrolledAt: &now, Hostname: nonEmpty(hostname), AgentVersion: nonEmpty(agentVersion),
		}); err != nil {
			return fmt.Errorf("mark enrolled: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.enroll", TargetType: "node", TargetID: et.NodeID.String(), ActorType: audit.ActorNode,
			Metadata: map[string]any{"hostname": hostname, "agent_version": agentVersion, "reenrolled": reenrolled},
		}); err != nil {
			return err
		}
		return s.event(ctx, tx, "node.enrolled", et.NodeID, nil)
	})
	if err != nil {
		return Enrollment{}, err
	}
	if reenrolled {
		_ = s.disconnect(ctx, out.NodeID, "node re-enrolled")
	}
	if s.Fabric != nil {
		out.FabricCA, out.FabricAddr = s.Fabric.CAPEM(), s.Fabric.Addr()
	}
	return out, nil
}

func (s *Service) insertNodeToken(ctx context.Context, q *nodesdb.Queries, nodeID uuid.UUID, now time.Time) (string, error) {
	tok, err := nodetoken.New(nodeID, s.Rand)
	if err != nil {
		return "", err
	}
	if _, err := q.InsertNodeToken(ctx, nodesdb.InsertNodeTokenParams{
		ID: s.IDs.New(), NodeID: nodeID, TokenHash: nodetoken.Hash(tok), CreatedAt: now,
	}); err != nil {
		return "", fmt.Errorf("insert node token: %w", err)
	}
	return tok, nil
}

// RotateToken replaces the node's live token, which must be presented, with a new one.
// The old token stops working when the transaction commits, and the node's tunnel (on
// the old token) is ended so the agent reconnects with the new one. Of two concurrent
// rotations with the same token one wins; the other is token_invalid.
func (s *Service) RotateToken(ctx context.Context, nodeID uuid.UUID, presented string) (string, error) {
	now := s.now()
	var tok string
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		live, err := q.LockLiveNodeToken(ctx, nodeID)
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.TokenInvalid, "node token is not valid")
		}
		if err != nil {
			return fmt.Errorf("lock node token: %w", err)
		}
		if !nodetoken.Verify(presented, live.TokenHash) {
			return apierr.New(apierr.TokenInvalid, "node token is not valid")
		}
		if _, err := q.RevokeNodeTokens(ctx, nodesdb.RevokeNodeTokensParams{NodeID: nodeID, RevokedAt: &now, RevokeReason: ptr(revokedRotated)}); err != nil {
			return fmt.Errorf("revoke node token: %w", err)
		}
		if tok, err = s.insertNodeToken(ctx, q, nodeID, now); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.token.rotate", TargetType: "node", TargetID: nodeID.String(), ActorType: audit.ActorNode,
		})
	})
	if err != nil {
		return "", err
	}
	// The agent holds the new token whatever happens to the old tunnel, so a failed
	// disconnect is logged, not returned.
	_ = s.disconnect(ctx, nodeID, "node token rotated")
	return tok, nil
}

// RevokeToken revokes the node's live token (an admin action) and ends its tunnel at
// once. revoked is false when the node had no live token. The node must enroll again.
// A failed disconnect is service_unavailable; retrying is safe.
func (s *Service) RevokeToken(ctx context.Context, nodeID uuid.UUID) (revoked bool, err error) {
	now := s.now()
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		if _, err := lockNode(ctx, q, nodeID); err != nil {
			return err
		}
		n, err := q.RevokeNodeTokens(ctx, nodesdb.RevokeNodeTokensParams{NodeID: nodeID, RevokedAt: &now, RevokeReason: ptr(revokedByAdmin)})
		if err != nil {
			return fmt.Errorf("revoke node token: %w", err)
		}
		if revoked = n > 0; !revoked {
			return nil
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.token.revoke", TargetType: "node", TargetID: nodeID.String(),
		}); err != nil {
			return err
		}
		return s.event(ctx, tx, "node.credentials_revoked", nodeID, nil)
	})
	if err != nil {
		return false, err
	}
	if derr := s.disconnect(ctx, nodeID, "node token revoked"); derr != nil {
		return revoked, apierr.New(apierr.ServiceUnavailable, "the token is revoked but the node's tunnel could not be ended; retry").Wrap(derr)
	}
	return revoked, nil
}

// Introspection is what the log gateway learns about a presented node token.
type Introspection struct {
	NodeID   uuid.UUID
	NodeName string
}

// Introspect describes the node whose token the chain authenticated (callerNode) when it
// is the node the path names; another node's id is 403 node_mismatch.
func (s *Service) Introspect(ctx context.Context, callerNode uuid.UUID, pathNode string) (Introspection, error) {
	if err := sameNode(callerNode, pathNode); err != nil {
		return Introspection{}, err
	}
	n, err := s.read(ctx).GetNode(ctx, callerNode)
	if errors.Is(err, pgx.ErrNoRows) {
		return Introspection{}, apierr.New(apierr.TokenInvalid, "node token is not valid")
	}
	if err != nil {
		return Introspection{}, fmt.Errorf("load node: %w", err)
	}
	return Introspection{NodeID: n.ID, NodeName: n.Name}, nil
}

// sameNode refuses a node-facing path whose {node_id} is not the authenticated node.
func sameNode(callerNode uuid.UUID, pathNode string) error {
	id, err := uuid.Parse(pathNode)
	if err != nil || id != callerNode {
		return apierr.New(apierr.InsufficientPermissions, "the node token belongs to another node").With("reason", "node_mismatch")
	}
	return nil
}

func lockNode(ctx context.Context, q *nodesdb.Queries, nodeID uuid.UUID) (nodesdb.Node, error) {
	n, err := q.LockNode(ctx, nodeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return n, apierr.NotFound(apierr.NodeNotFound, "node")
	}
	if err != nil {
		return n, fmt.Errorf("lock node: %w", err)
	}
	return n, nil
}
