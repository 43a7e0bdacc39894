package auth

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

const (
	// rsaBits: RS256 with 2048-bit keys. Asymmetric, so verifiers never hold a signing
	// secret, and verification (every request) is far cheaper than signing.
	rsaBits = 2048

	// signingKeyLockID is the pg_advisory_xact_lock key that serializes key creation and
	// rotation across replicas ("gantry.auth.signing_keys").
	signingKeyLockID int64 = 0x6761_6e74_7279_0a01

	// keyCacheMaxAge bounds how stale a replica's view of the key set may be when it
	// signs or serves the JWKS: after another replica rotates, this one keeps signing
	// with the retired key for at most this long.
	keyCacheMaxAge = 30 * time.Second

	stateActive  = "active"
	stateRetired = "retired"
)

// ErrNoActiveKey is returned when signing is asked of a keyring without an active key
// (EnsureActive was never run against this database).
var ErrNoActiveKey = errors.New("auth: no active signing key")

// Keyring owns the signing keys: it creates and rotates them in the database and holds
// the published set (public keys, and the active private key) in memory.
type Keyring struct {
	pool   *pgxpool.Pool
	master MasterKey
	cfg    Config
	clock  clock.Clock
	ids    ids.Source
	audit  *audit.Log

	mu       sync.RWMutex
	active   *activeKey
	keys     map[string]publishedKey
	loadedAt time.Time
}

type activeKey struct {
	kid  string
	priv *rsa.PrivateKey
}

type publishedKey struct {
	pub *rsa.PublicKey
	jwk map[string]any
	// expiresAt is when the key leaves the set; zero while the key is active.
	expiresAt time.Time
}

// NewKeyring returns a keyring over pool. cfg.MasterKey must be set (Config.Validate).
// Nothing is loaded until EnsureActive or Reload.
func NewKeyring(pool *pgxpool.Pool, cfg Config, clk clock.Clock, idSrc ids.Source) (*Keyring, error) {
	if !cfg.MasterKey.IsSet() {
		return nil, errors.New("auth: keyring needs a master key")
	}
	return &Keyring{
		pool: pool, master: cfg.MasterKey, cfg: cfg, clock: clk, ids: idSrc,
		audit: &audit.Log{Clock: clk, IDs: idSrc},
		keys:  map[string]publishedKey{},
	}, nil
}

// RetiredKeyGrace is how long a retired key stays published: the longest an access
// token it signed can live (TTL + exp leeway), plus how long another replica may go on
// signing with it before it notices the rotation.
func (k *Keyring) RetiredKeyGrace() time.Duration {
	return k.cfg.AccessTokenTTL + Leeway + keyCacheMaxAge
}

// EnsureActive creates the first signing key when there is none, then loads the set.
func (k *Keyring) EnsureActive(ctx context.Context) error {
	err := db.InTx(ctx, k.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		if err := q.LockSigningKeys(ctx, signingKeyLockID); err != nil {
			return fmt.Errorf("lock signing keys: %w", err)
		}
		if _, err := q.GetActiveSigningKey(ctx); err == nil {
			return nil
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("active signing key: %w", err)
		}
		kid, err := k.insertKey(ctx, q)
		if err != nil {
			return err
		}
		return k.audit.Record(ctx, tx, audit.Entry{
			Action: "auth.signing_key.create", TargetType: "signing_key", TargetID: kid,
			ActorType: audit.ActorSystem,
		})
	})
	if err != nil {
		return err
	}
	return k.Reload(ctx)
}

// RotateIfDue creates a new active key when the active one is older than the rotation
// period, retiring the old one (published until RetiredKeyGrace has passed). It
// creates the first key when there is none. It reports whether a key was created.
func (k *Keyring) RotateIfDue(ctx context.Context) (rotated bool, err error) {
	err = db.InTx(ctx, k.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		if err := q.LockSigningKeys(ctx, signingKeyLockID); err != nil {
			return fmt.Errorf("lock signing keys: %w", err)
		}
		now := k.clock.Now()
		cur, err := q.GetActiveSigningKey(ctx)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// No key at all: nothing to retire.
		case err != nil:
			return fmt.Errorf("active signing key: %w", err)
		case now.Sub(cur.CreatedAt) < k.cfg.SigningKeyRotation:
			return nil
		default:
			if _, err := q.RetireSigningKey(ctx, authdb.RetireSigningKeyParams{
				Kid: cur.Kid, RetiredAt: &now, ExpiresAt: ptr(now.Add(k.RetiredKeyGrace())),
			}); err != nil {
				return fmt.Errorf("retire signing key: %w", err)
			}
		}
		kid, err := k.insertKey(ctx, q)
		if err != nil {
			return err
		}
		meta := map[string]any{"algorithm": "RS256"}
		if cur.Kid != uuid.Nil {
			meta["retired_kid"] = cur.Kid.String()
		}
		rotated = true
		return k.audit.Record(ctx, tx, audit.Entry{
			Action: "auth.signing_key.rotate", TargetType: "signing_key", TargetID: kid,
			ActorType: audit.ActorSystem, Metadata: meta,
		})
	})
	if err != nil {
		return false, err
	}
	return rotated, k.Reload(ctx)
}

// insertKey generates a key pair and stores it as the active key.
func (k *Keyring) insertKey(ctx context.Context, q *authdb.Queries) (string, error) {
	priv, err := rsa.GenerateKey(rand.Reader, rsaBits)
	if err != nil {
		return "", fmt.Errorf("generate signing key: %w", err)
	}
	kidUUID := k.ids.New()
	kid := kidUUID.String()
	pubJWK, err := publicJWK(kid, &priv.PublicKey)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", fmt.Errorf("encode signing key: %w", err)
	}
	enc, err := k.master.seal(der, kid)
	if err != nil {
		return "", err
	}
	if err := q.InsertSigningKey(ctx, authdb.InsertSigningKeyParams{
		Kid: kidUUID, PublicJwk: pubJWK, PrivateKeyEnc: enc, CreatedAt: k.clock.Now(),
	}); err != nil {
		return "", fmt.Errorf("insert signing key: %w", err)
	}
	return kid, nil
}

// Reload replaces the in-memory set with the published keys of the database: the
// active key (whose private half it decrypts) and the retired keys not yet expired.
func (k *Keyring) Reload(ctx context.Context) error {
	return k.reload(ctx, authdb.New(k.pool))
}

// reload is Reload through q: a caller inside a transaction passes its own, so a stale
// set is read on the connection it already holds rather than a second one from the
// pool (concurrent sign-ins of one user queue on a row lock, each holding a connection;
// the one holding the lock must not wait for a free connection to sign its token).
func (k *Keyring) reload(ctx context.Context, q *authdb.Queries) error {
	now := k.clock.Now()
	rows, err := q.ListPublishedSigningKeys(ctx, &now)
	if err != nil {
		return fmt.Errorf("load signing keys: %w", err)
	}
	keys := make(map[string]publishedKey, len(rows))
	var active *activeKey
	for _, row := range rows {
		kid := row.Kid.String()
		pub, doc, err := parsePublicJWK(row.PublicJwk)
		if err != nil {
			return fmt.Errorf("signing key %s: %w", kid, err)
		}
		pk := publishedKey{pub: pub, jwk: doc}
		if row.State == stateActive {
			der, err := k.master.open(row.PrivateKeyEnc, kid)
			if err != nil {
				return fmt.Errorf("signing key %s: %w", kid, err)
			}
			parsed, err := x509.ParsePKCS8PrivateKey(der)
			if err != nil {
				return fmt.Errorf("signing key %s: decode private key: %w", kid, err)
			}
			priv, ok := parsed.(*rsa.PrivateKey)
			if !ok || !priv.PublicKey.Equal(pub) {
				return fmt.Errorf("signing key %s: private key does not match its public key", kid)
			}
			active = &activeKey{kid: kid, priv: priv}
		} else if row.ExpiresAt != nil {
			pk.expiresAt = *row.ExpiresAt
		}
		keys[kid] = pk
	}
	k.mu.Lock()
	k.keys, k.active, k.loadedAt = keys, active, now
	k.mu.Unlock()
	return nil
}

// reloadIfStale reloads when the set is older than keyCacheMaxAge.
func (k *Keyring) reloadIfStale(ctx context.Context) error {
	return k.reloadIfStaleWith(ctx, nil)
}

// reloadIfStaleWith is reloadIfStale through q (nil: the pool).
func (k *Keyring) reloadIfStaleWith(ctx context.Context, q *authdb.Queries) error {
	k.mu.RLock()
	fresh := !k.loadedAt.IsZero() && k.clock.Now().Sub(k.loadedAt) < keyCacheMaxAge
	k.mu.RUnlock()
	if fresh {
		return nil
	}
	if q == nil {
		q = authdb.New(k.pool)
	}
	return k.reload(ctx, q)
}

// signer is the active key, reloading a stale set first.
func (k *Keyring) signer(ctx context.Context) (*activeKey, error) {
	return k.signerWith(ctx, nil)
}

// signerWith is signer reading a stale set through q (nil: the pool); see reload.
func (k *Keyring) signerWith(ctx context.Context, q *authdb.Queries) (*activeKey, error) {
	if err := k.reloadIfStaleWith(ctx, q); err != nil {
		return nil, err
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.active == nil {
		return nil, ErrNoActiveKey
	}
	return k.active, nil
}

// verificationKey is the public key kid names, if it is published at now. It never
// touches the database.
func (k *Keyring) verificationKey(kid string, now time.Time) (*rsa.PublicKey, bool) {
	k.mu.RLock()
	pk, ok := k.keys[kid]
	k.mu.RUnlock()
	if !ok || (!pk.expiresAt.IsZero() && !now.Before(pk.expiresAt)) {
		return nil, false
	}
	return pk.pub, true
}

// PublicKeys is the JWK Set document: each published key as a JWK (kty, n, e, kid,
// alg, use), the active key first. It reloads a stale set first.
func (k *Keyring) PublicKeys(ctx context.Context) ([]map[string]any, error) {
	if err := k.reloadIfStale(ctx); err != nil {
		return nil, err
	}
	now := k.clock.Now()
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]map[string]any, 0, len(k.keys))
	if k.active != nil {
		out = append(out, k.keys[k.active.kid].jwk)
	}
	retired := make([]publishedKey, 0, len(k.keys))
	for kid, pk := range k.keys {
		if (k.active != nil && kid == k.active.kid) || !now.Before(pk.expiresAt) {
			continue
		}
		retired = append(retired, pk)
	}
	// Most recently retired first, so the document is stable between calls.
	slices.SortFunc(retired, func(a, b publishedKey) int { return b.expiresAt.Compare(a.expiresAt) })
	for _, pk := range retired {
		out = append(out, pk.jwk)
	}
	return out, nil
}

// ActiveKID is the kid of the active key in memory ("" when none).
func (k *Keyring) ActiveKID() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.active == nil {
		return ""
	}
	return k.active.kid
}

// publicJWK renders pub as the JSON of a public JWK.
func publicJWK(kid string, pub *rsa.PublicKey) ([]byte, error) {
	key, err := jwk.Import(pub)
	if err != nil {
		return nil, fmt.Errorf("jwk import: %w", err)
	}
	for name, v := range map[string]any{jwk.KeyIDKey: kid, jwk.AlgorithmKey: jwa.RS256(), jwk.KeyUsageKey: jwk.ForSignature} {
		if err := key.Set(name, v); err != nil {
			return nil, fmt.Errorf("jwk %s: %w", name, err)
		}
	}
	return json.Marshal(key)
}

// parsePublicJWK reads a stored public JWK; a JWK carrying private members is refused.
func parsePublicJWK(data []byte) (*rsa.PublicKey, map[string]any, error) {
	key, err := jwk.ParseKey(data)
	if err != nil {
		return nil, nil, fmt.Errorf("parse public jwk: %w", err)
	}
	if private, err := jwk.IsPrivateKey(key); err != nil || private {
		return nil, nil, errors.New("stored jwk is not a public key")
	}
	var pub rsa.PublicKey
	if err := jwk.Export(key, &pub); err != nil {
		return nil, nil, fmt.Errorf("export public jwk: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("public jwk document: %w", err)
	}
	return &pub, doc, nil
}

// seal encrypts plaintext with AES-256-GCM; kid is the additional data.
func (m MasterKey) seal(plaintext []byte, kid string) ([]byte, error) {
	return m.sealAD(plaintext, aad(kid))
}

// open decrypts what seal produced for kid.
func (m MasterKey) open(sealed []byte, kid string) ([]byte, error) {
	return m.openAD(sealed, aad(kid), "private key")
}

// sealAD encrypts plaintext with AES-256-GCM under the master key, bound to the
// additional data ad (a sealed value copied elsewhere does not open): nonce || sealed.
func (m MasterKey) sealAD(plaintext, ad []byte) ([]byte, error) {
	aead, err := m.aead()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return nil, fmt.Errorf("nonce: %w", err)
	}
	return aead.Seal(nonce, nonce, plaintext, ad), nil
}

// openAD decrypts what sealAD produced for ad; what names the value in errors.
func (m MasterKey) openAD(sealed, ad []byte, what string) ([]byte, error) {
	aead, err := m.aead()
	if err != nil {
		return nil, err
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, fmt.Errorf("encrypted %s is truncated", what)
	}
	n := aead.NonceSize()
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], ad)
	if err != nil {
		return nil, fmt.Errorf("cannot decrypt %s: wrong GANTRY_MASTER_KEY or corrupted row", what)
	}
	return plain, nil
}

func (m MasterKey) aead() (cipher.AEAD, error) {
	if !m.set {
		return nil, errors.New("master key not set")
	}
	block, err := aes.NewCipher(m.key[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func aad(kid string) []byte { return []byte("gantry/auth/signing-key/" + kid) }

func ptr[T any](v T) *T { return &v }
