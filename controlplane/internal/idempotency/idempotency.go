// Package idempotency makes create operations safe to retry (seed §1, §5 rule 12). A
// request with an Idempotency-Key runs inside one database transaction that also stores
// the key and the response, so the key exists exactly when the mutation committed:
//
//   - same key, same body, completed: the stored status and body are replayed with
//     Idempotent-Replayed: true ("same" compares a JSON body in canonical form, so
//     whitespace, key order and string escapes do not matter: fingerprint.go);
//   - same key, different body: 422 validation_error, nothing runs;
//   - same key while the first request still runs: 409 invalid_request;
//   - the handler fails (non-2xx): the transaction rolls back and the key is not kept, so
//     a retry runs again.
//
// Keys are scoped by principal, method and route pattern. Only JSON response bodies are
// stored, with secret-like fields redacted; empty and non-JSON bodies are never
// persisted, only counted.
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/idempotency/idemdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/metrics"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/redact"
)

// Header names.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
	// MaxKeyLength is the contract's limit (seed §8).
	MaxKeyLength = 128
	// MinRetention is the shortest time a key is kept.
	MinRetention = 24 * time.Hour
)

// Store runs idempotent requests.
type Store struct {
	Pool      *pgxpool.Pool
	Clock     clock.Clock
	Metrics   *metrics.API
	Retention time.Duration
}

// FailFunc writes an error response (the server's one error mapper).
type FailFunc func(w http.ResponseWriter, r *http.Request, err error)

// CheckKey validates the header before anything else looks at the request: a key
// longer than the contract allows is a malformed request (400), not a field error.
func CheckKey(r *http.Request) (string, error) {
	key := r.Header.Get(HeaderKey)
	if len(key) > MaxKeyLength {
		return "", apierr.New(apierr.InvalidRequest, "Idempotency-Key is longer than %d characters", MaxKeyLength).
			With("field", HeaderKey).With("reason", "key_too_long")
	}
	return key, nil
}

// Scope identifies whose key it is and what operation it guards.
type Scope struct {
	Principal string
	Method    string
	Route     string
	Key       string
}

// Serve runs next idempotently for scope; body is the request body already read.
func (s *Store) Serve(w http.ResponseWriter, r *http.Request, scope Scope, body []byte, next http.Handler, fail FailFunc) {
	ctx := r.Context()
	hash, accept := fingerprints(r, scope, body)
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		fail(w, r, apierr.New(apierr.ServiceUnavailable, "database unavailable").Wrap(err))
		return
	}
	committed := false
	defer func() {
		if !committed {
			// Bounded: a frozen database must not hold the request (and the
			// connection) past the deadline; the server aborts an unfinished
			// transaction whose connection closed.
			db.Rollback(ctx, tx)
		}
	}()

	// A transaction-scoped advisory lock tells a concurrent duplicate apart without
	// waiting for the first request to finish; the key is read after it.
	locked, prev, err := lockAndRead(ctx, tx, scope)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		fail(w, r, apierr.Internal(err))
		return
	}
	if !locked {
		fail(w, r, apierr.New(apierr.InvalidRequest, "a request with this Idempotency-Key is still being processed").
			With("reason", "idempotency_key_in_progress").WithStatus(http.StatusConflict))
		return
	}

	q := idemdb.New(tx)
	now := s.Clock.Now()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		fail(w, r, apierr.Internal(err))
		return
	case !prev.ExpiresAt.After(now):
		// An expired key is forgotten and the request runs afresh.
		if err := q.DeleteExpiredIdempotencyKey(ctx, idemdb.DeleteExpiredIdempotencyKeyParams{
			Principal: scope.Principal, Method: scope.Method, Route: scope.Route, IdempotencyKey: scope.Key, ExpiresAt: now,
		}); err != nil {
			fail(w, r, apierr.Internal(err))
			return
		}
	case !slices.ContainsFunc(accept, func(fp []byte) bool { return bytes.Equal(prev.RequestHash, fp) }):
		fail(w, r, apierr.New(apierr.ValidationError, "Idempotency-Key was already used with a different request body").
			With("field", HeaderKey).With("reason", "idempotency_key_reused"))
		return
	default:
		s.Metrics.IdempotencyReplays.Inc()
		h := w.Header()
		h.Set(HeaderReplayed, "true")
		if len(prev.ResponseBody) > 0 {
			h.Set("Content-Type", "application/json")
		}
		w.WriteHeader(int(prev.StatusCode))
		_, _ = w.Write(prev.ResponseBody)
		return
	}

	rec := newRecorder()
	next.ServeHTTP(rec, r.WithContext(db.WithTx(ctx, tx)))
	if rec.status < 200 || rec.status > 299 {
		rec.flushTo(w) // the deferred rollback undoes anything the handler wrote
		return
	}
	stored := s.storedBody(rec)
	if err := q.InsertIdempotencyKey(ctx, idemdb.InsertIdempotencyKeyParams{
		Principal: scope.Principal, Method: scope.Method, Route: scope.Route, IdempotencyKey: scope.Key,
		RequestHash: hash, StatusCode: int32(rec.status), ResponseBody: stored,
		CreatedAt: now, ExpiresAt: now.Add(s.retention()),
	}); err != nil {
		fail(w, r, apierr.Internal(fmt.Errorf("store idempotency key: %w", err)))
		return
	}
	if err := tx.Commit(ctx); err != nil {
		fail(w, r, apierr.Internal(fmt.Errorf("commit idempotent request: %w", err)))
		return
	}
	committed = true
	rec.flushTo(w)
}

// readKeySQL is idemdb.GetIdempotencyKey's SQL, sent in lockAndRead's batch (sqlc's
// method cannot join one); TestReadKeySQLIsTheGeneratedQuery keeps the two equal.
const readKeySQL = `SELECT request_hash, status_code, response_body, expires_at
FROM idempotency_keys
WHERE principal = $1 AND method = $2 AND route = $3 AND idempotency_key = $4`

// lockAndRead tries the scope's advisory lock, then reads its stored key (pgx.ErrNoRows
// when there is none), in one round trip. They stay two statements: in READ COMMITTED
// each statement reads a snapshot taken when it starts, so the read, which starts
// after the lock is held, sees a first request's key if that request committed before
// the lock was released to this one. (One statement would read a snapshot taken before
// it took the lock, and could miss the key of a request committing meanwhile.) The
// read runs whether or not the lock was free; when it was not, its answer is ignored.
func lockAndRead(ctx context.Context, tx pgx.Tx, scope Scope) (bool, idemdb.GetIdempotencyKeyRow, error) {
	var locked bool
	var prev idemdb.GetIdempotencyKeyRow
	var readErr error
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_try_advisory_xact_lock($1)`, scope.lockKey()).QueryRow(func(row pgx.Row) error {
		return row.Scan(&locked)
	})
	b.Queue(readKeySQL, scope.Principal, scope.Method, scope.Route, scope.Key).QueryRow(func(row pgx.Row) error {
		readErr = row.Scan(&prev.RequestHash, &prev.StatusCode, &prev.ResponseBody, &prev.ExpiresAt)
		if errors.Is(readErr, pgx.ErrNoRows) {
			return nil
		}
		return readErr
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, prev, err
	}
	return locked, prev, readErr
}

// storedBody is the sanitized JSON to keep, or nil (counted) when the body is not kept.
func (s *Store) storedBody(rec *recorder) []byte {
	body := rec.body.Bytes()
	if len(bytes.TrimSpace(body)) == 0 {
		s.Metrics.IdempotencySkippedEmpty.Inc()
		return nil
	}
	ct := rec.header.Get("Content-Type")
	if !strings.HasPrefix(ct, "application/json") && !strings.HasSuffix(strings.SplitN(ct, ";", 2)[0], "+json") {
		s.Metrics.IdempotencySkippedNonJSON.Inc()
		return nil
	}
	var doc any
	if err := json.Unmarshal(body, &doc); err != nil {
		s.Metrics.IdempotencySkippedNonJSON.Inc()
		return nil
	}
	s.Metrics.IdempotencyPersistedJSON.Inc()
	if _, secret := redact.FirstSecretField(doc); !secret {
		return body // kept byte for byte, so a replay is identical
	}
	clean, _ := redact.JSON(body)
	return clean
}

func (s *Store) retention() time.Duration {
	if s.Retention < MinRetention {
		return MinRetention
	}
	return s.Retention
}

// Sweep deletes expired keys and returns how many.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	return idemdb.New(s.Pool).DeleteExpiredIdempotencyKeys(ctx, s.Clock.Now())
}

// lockKey is the advisory lock of one scope: the first 8 bytes of its SHA-256.
func (sc Scope) lockKey() int64 {
	sum := sha256.Sum256([]byte("idempotency\x00" + sc.Principal + "\x00" + sc.Method + "\x00" + sc.Route + "\x00" + sc.Key))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// recorder buffers a response so it can be stored before the client sees it.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, status: http.StatusOK} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}

func (r *recorder) flushTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
