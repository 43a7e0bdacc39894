package sshkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/sshkeys/sshkeysdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Key is a stored public key.
type Key = sshkeysdb.SshKey

// ErrNoResolvableKey is wrapped by Resolve's refusals.
var ErrNoResolvableKey = errors.New("no resolvable ssh key")

// Service stores and resolves users' keys.
type Service struct {
	Pool  *pgxpool.Pool
	Clock clock.Clock
	IDs   ids.Source
	Audit *audit.Log
}

// New returns a Service whose audit log shares clk and idSrc.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source) *Service {
	return &Service{Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}}
}

func (s *Service) read(ctx context.Context) *sshkeysdb.Queries {
	return sshkeysdb.New(db.Querier(ctx, s.Pool))
}

// Page is one page of keys; More says whether keys follow the last one.
type Page struct {
	Items []Key
	More  bool
}

// List is a page of the user's keys, by id.
func (s *Service) List(ctx context.Context, userID, after uuid.UUID, limit int) (Page, error) {
	rows, err := s.read(ctx).ListKeys(ctx, sshkeysdb.ListKeysParams{
		UserID: userID, After: uuid.NullUUID{UUID: after, Valid: after != uuid.Nil}, Limit: int32(limit + 1),
	})
	if err != nil {
		return Page{}, fmt.Errorf("list ssh keys: %w", err)
	}
	if rows == nil {
		rows = []Key{}
	}
	if len(rows) > limit {
		return Page{Items: rows[:limit], More: true}, nil
	}
	return Page{Items: rows}, nil
}

// Create validates publicKey and stores it for the user under name. tenantID (uuid.Nil
// when none) goes to the audit row.
func (s *Service) Create(ctx context.Context, userID, tenantID uuid.UUID, name, publicKey string) (Key, error) {
	parsed, err := Parse(publicKey)
	if err != nil {
		return Key{}, err
	}
	var comment *string
	if parsed.Comment != "" {
		comment = &parsed.Comment
	}
	var out Key
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		out, err = sshkeysdb.New(tx).InsertKey(ctx, sshkeysdb.InsertKeyParams{
			ID: s.IDs.New(), UserID: userID, Name: name, KeyType: parsed.Type, PublicKey: parsed.PublicKey,
			Comment: comment, Fingerprint: parsed.Fingerprint, Bits: int32(parsed.Bits), CreatedAt: s.Clock.Now(),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			e := apierr.New(apierr.InvalidRequest, "this key is already on your account").
				With("field", "public_key").With("reason", "duplicate_key").With("fingerprint", parsed.Fingerprint)
			e.Status = 409
			return e
		}
		if err != nil {
			return fmt.Errorf("insert ssh key: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "ssh_key.create", TargetType: "ssh_key", TargetID: out.ID.String(), TenantID: tenantID,
			Metadata: map[string]any{"fingerprint": out.Fingerprint, "key_type": out.KeyType},
		})
	})
	return out, err
}

// Delete removes one of the user's keys; another user's key is not found.
func (s *Service) Delete(ctx context.Context, userID, tenantID, keyID uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		k, err := sshkeysdb.New(tx).DeleteKey(ctx, sshkeysdb.DeleteKeyParams{ID: keyID, UserID: userID})
		if errors.Is(err, pgx.ErrNoRows) {
			e := apierr.New(apierr.InvalidRequest, "ssh key not found").With("reason", "not_found")
			e.Status = 404
			return e
		}
		if err != nil {
			return fmt.Errorf("delete ssh key: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "ssh_key.delete", TargetType: "ssh_key", TargetID: keyID.String(), TenantID: tenantID,
			Metadata: map[string]any{"fingerprint": k.Fingerprint},
		})
	})
}

// Resolve is the keys an allocation of userID installs: the keys named by keyIDs, which
// must all be the user's, or every key of the user when keyIDs is empty. It refuses
// (validation_error on ssh_key_ids, wrapping ErrNoResolvableKey) when a named key is not
// the user's or when no key results.
func (s *Service) Resolve(ctx context.Context, userID uuid.UUID, keyIDs []uuid.UUID) ([]Key, error) {
	q := s.read(ctx)
	if len(keyIDs) == 0 {
		keys, err := q.AllKeys(ctx, userID)
		if err != nil {
			return nil, fmt.Errorf("resolve ssh keys: %w", err)
		}
		if len(keys) == 0 {
			return nil, apierr.Validation("ssh_key_ids", "add an SSH key to your account first").
				With("reason", "no_ssh_key").Wrap(ErrNoResolvableKey)
		}
		return keys, nil
	}
	want := slices.Clone(keyIDs)
	slices.SortFunc(want, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	want = slices.Compact(want)
	keys, err := q.KeysByID(ctx, sshkeysdb.KeysByIDParams{UserID: userID, Ids: want})
	if err != nil {
		return nil, fmt.Errorf("resolve ssh keys: %w", err)
	}
	if len(keys) != len(want) {
		var missing []string
		for _, id := range want {
			if !slices.ContainsFunc(keys, func(k Key) bool { return k.ID == id }) {
				missing = append(missing, id.String())
			}
		}
		return nil, apierr.Validation("ssh_key_ids", "SSH key not found on your account").
			With("reason", "ssh_key_not_found").With("key_ids", missing).Wrap(ErrNoResolvableKey)
	}
	return keys, nil
}
