package payments

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Signature scheme of the provider's webhooks (Stripe's): the header
//
//	Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>[,v1=...]
//
// carries one timestamp and one or more v1 signatures (the provider sends one per active
// endpoint secret while a secret is being rolled). Other schemes (v0) are ignored.
const (
	// SignatureHeader is the header the provider signs with.
	SignatureHeader = "Stripe-Signature"
	// SignatureMaxAge: a timestamp older than this is refused (a replayed delivery).
	SignatureMaxAge = 300 * time.Second
	// SignatureFutureSkew: a timestamp further than this ahead of our clock is refused.
	// Provider and control plane both run NTP; 30 s covers a sick clock without letting a
	// forged future timestamp extend the replay window meaningfully.
	SignatureFutureSkew = 30 * time.Second
	// maxSignatures bounds the work an attacker can make us do per request.
	maxSignatures = 8
)

// Reasons a signature is refused (details.reason of payment_signature_invalid; they name
// what is wrong without helping a forger).
var (
	errSigMissing   = errors.New("signature_missing")
	errSigMalformed = errors.New("signature_malformed")
	errSigStale     = errors.New("timestamp_too_old")
	errSigFuture    = errors.New("timestamp_in_future")
	errSigMismatch  = errors.New("signature_mismatch")
	errSigNoSecret  = errors.New("no_secret_configured")
)

// Sign returns a Stripe-Signature header value over body at t with each secret (one v1
// per secret). Tests and the local provider fake use it.
func Sign(body []byte, t time.Time, secrets ...[]byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=" + ts)
	for _, s := range secrets {
		b.WriteString(",v1=" + hex.EncodeToString(mac(s, ts, body)))
	}
	return b.String()
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// VerifySignature checks header against body with any of secrets at now. It accepts
// when some v1 value equals the HMAC under some secret (constant-time compare) and the
// timestamp lies in [now-SignatureMaxAge, now+SignatureFutureSkew], both ends included.
func VerifySignature(header string, body []byte, secrets [][]byte, now time.Time) error {
	if len(secrets) == 0 {
		return errSigNoSecret
	}
	if header == "" {
		return errSigMissing
	}
	var (
		ts     string
		tsSeen bool
		sigs   [][]byte
	)
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return errSigMalformed
		}
		switch k {
		case "t":
			if tsSeen {
				return errSigMalformed // two timestamps: which one was signed?
			}
			ts, tsSeen = v, true
		case "v1":
			if len(sigs) == maxSignatures {
				return errSigMalformed
			}
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				continue // a malformed value cannot match; another one may
			}
			sigs = append(sigs, sig)
		}
	}
	if !tsSeen || len(sigs) == 0 {
		return errSigMalformed
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || unix <= 0 || strconv.FormatInt(unix, 10) != ts {
		return errSigMalformed
	}
	at := time.Unix(unix, 0)
	if now.Sub(at) > SignatureMaxAge {
		return errSigStale
	}
	if at.Sub(now) > SignatureFutureSkew {
		return errSigFuture
	}
	matched := false
	for _, secret := range secrets {
		want := mac(secret, ts, body)
		for _, sig := range sigs {
			// Every pair is compared (no early exit) so timing says nothing about which
			// secret or which value matched.
			if hmac.Equal(want, sig) {
				matched = true
			}
		}
	}
	if !matched {
		return errSigMismatch
	}
	return nil
}
