package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The browser's way in. A browser cannot send a bearer token with a navigation, so a
// caller holding one (the console) mints an exchange code for an instance; the browser
// opens the exchange URL once; the exchange spends the code and sets a cookie that is
// HTTP-only, SameSite=Strict and scoped to the instance's proxy path, then redirects
// to the app. The code is 32 random bytes, valid for ExchangeTTL and for one use, kept
// (as its SHA-256 only) in a JetStream KV bucket every replica reads; the use is a
// compare-and-set on the entry's revision, so of concurrent presentations exactly one
// wins. The cookie is stateless: claims and an HMAC-SHA256 under a key derived from
// the master key. It names the user and the instance; access to the instance's
// project is checked again on every request, so removing a member locks them out at
// once.

// CookieName is the instance cookie (its path scopes it to one instance).
const CookieName = "gantry_app_proxy"

// codeClaims are what an exchange code stands for.
type codeClaims struct {
	Instance   string `json:"inst"`
	User       string `json:"user"`
	Tenant     string `json:"tenant"`
	TenantRole string `json:"trole,omitempty"`
	Username   string `json:"uname,omitempty"`
	Expires    int64  `json:"exp"` // unix ms
	Used       bool   `json:"used,omitempty"`
}

type codeStore struct {
	js     jetstream.JetStream
	bucket string
	ttl    time.Duration

	mu sync.Mutex
	kv jetstream.KeyValue
}

func (c *codeStore) open(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv != nil {
		return c.kv, nil
	}
	// Entries outlive their codes a little, so a late replay is still recognised as one.
	kv, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: c.bucket, Description: "gantry app proxy exchange codes (sha256 -> claims)", History: 1, TTL: 2 * c.ttl,
	})
	if err != nil {
		return nil, fmt.Errorf("app proxy: code bucket: %w", err)
	}
	c.kv = kv
	return kv, nil
}

func codeKey(code string) string {
	h := sha256.Sum256([]byte(code))
	return hex.EncodeToString(h[:])
}

// mint stores a new code for claims and returns it.
func (c *codeStore) mint(ctx context.Context, cl codeClaims) (string, error) {
	kv, err := c.open(ctx)
	if err != nil {
		return "", err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	code := base64.RawURLEncoding.EncodeToString(raw)
	b, _ := json.Marshal(cl)
	if _, err := kv.Create(ctx, codeKey(code), b); err != nil {
		return "", fmt.Errorf("app proxy: store code: %w", err)
	}
	return code, nil
}

var errCodeReplayed = errors.New("exchange code already used")

// consume spends a code: its claims, or token_invalid (unknown, used: errCodeReplayed
// wrapped) or token_expired.
func (c *codeStore) consume(ctx context.Context, code string, now time.Time) (codeClaims, error) {
	var cl codeClaims
	invalid := apierr.New(apierr.TokenInvalid, "the exchange code is not valid")
	if len(code) != 43 {
		return cl, invalid
	}
	kv, err := c.open(ctx)
	if err != nil {
		return cl, err
	}
	key := codeKey(code)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return cl, invalid
	}
	if err != nil {
		return cl, fmt.Errorf("app proxy: read code: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &cl); err != nil {
		return cl, invalid
	}
	if cl.Used {
		return cl, invalid.Wrap(errCodeReplayed)
	}
	if now.UnixMilli() >= cl.Expires {
		return cl, apierr.New(apierr.TokenExpired, "the exchange code has expired")
	}
	used := cl
	used.Used = true
	b, _ := json.Marshal(used)
	if _, err := kv.Update(ctx, key, b, e.Revision()); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || strings.Contains(err.Error(), "wrong last sequence") {
			return cl, invalid.Wrap(errCodeReplayed) // another presentation won
		}
		return cl, fmt.Errorf("app proxy: spend code: %w", err)
	}
	return cl, nil
}

// cookieClaims are the instance cookie's.
type cookieClaims struct {
	Instance   string `json:"inst"`
	User       string `json:"user"`
	Tenant     string `json:"tenant"`
	TenantRole string `json:"trole,omitempty"`
	Username   string `json:"uname,omitempty"`
	Expires    int64  `json:"exp"` // unix ms
}

var b64 = base64.RawURLEncoding

func (s *Service) signCookie(c cookieClaims) string {
	body, _ := json.Marshal(c)
	mac := hmac.New(sha256.New, s.deps.CookieKey)
	mac.Write(body)
	return b64.EncodeToString(body) + "." + b64.EncodeToString(mac.Sum(nil))
}

// cookiePrincipal verifies an instance cookie for instanceID and returns its user.
func (s *Service) cookiePrincipal(v string, instanceID uuid.UUID) (*principal.Principal, error) {
	invalid := apierr.New(apierr.TokenInvalid, "the app proxy cookie is not valid")
	body64, mac64, ok := strings.Cut(v, ".")
	if !ok {
		return nil, invalid
	}
	body, err1 := b64.DecodeString(body64)
	sig, err2 := b64.DecodeString(mac64)
	if err1 != nil || err2 != nil {
		return nil, invalid
	}
	mac := hmac.New(sha256.New, s.deps.CookieKey)
	mac.Write(body)
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return nil, invalid
	}
	var c cookieClaims
	if err := json.Unmarshal(body, &c); err != nil || c.Instance != instanceID.String() {
		return nil, invalid
	}
	if s.deps.Clock.Now().UnixMilli() >= c.Expires {
		return nil, apierr.New(apierr.TokenExpired, "the app proxy cookie has expired: open the app again")
	}
	user, err1 := uuid.Parse(c.User)
	tenant, err2 := uuid.Parse(c.Tenant)
	if err1 != nil || err2 != nil {
		return nil, invalid
	}
	return &principal.Principal{UserID: user, TenantID: tenant, TenantRole: c.TenantRole, Username: c.Username}, nil
}
