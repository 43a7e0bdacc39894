package payments

import (
	"bytes"
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzVerifySignature checks the webhook signature header parser against arbitrary
// headers and bodies, as anyone who can reach the webhook endpoint can send them.
// Properties: no panic; every refusal is one of the documented reasons; a header is
// accepted only when it carries exactly one canonical timestamp inside the window and a
// v1 value that is the HMAC of "<t>.<body>" under one of the secrets (an oracle written
// independently of the parser); a header made by Sign at now+offset is accepted exactly
// when the offset lies in [-SignatureMaxAge, +SignatureFutureSkew], and refused as stale
// or future otherwise; more than maxSignatures well-formed v1 values are refused.
func FuzzVerifySignature(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	secrets := [][]byte{[]byte("whsec_current"), []byte("whsec_previous")}
	body := []byte(`{"id":"evt_1","object":"event"}`)
	f.Add(Sign(body, now, secrets[0]), body, int64(0))
	f.Add(Sign(body, now.Add(-SignatureMaxAge), secrets[1]), body, int64(-300))
	f.Add(Sign(body, now.Add(SignatureFutureSkew+time.Second), secrets...), body, int64(31))
	f.Add("t=1700000000,v1="+strings.Repeat("ab", 32)+",v0=zz", []byte("{}"), int64(-301))
	f.Add("t=1700000000,t=1700000000,v1=00", []byte(nil), int64(1))
	f.Add(strings.Repeat("v1="+strings.Repeat("00", 32)+",", 9)+"t=1700000000", body, int64(0))
	f.Add("t=01700000000,v1=", body, int64(0))
	f.Add("garbage", body, int64(0))
	f.Fuzz(func(t *testing.T, header string, body []byte, offset int64) {
		err := VerifySignature(header, body, secrets, now)
		known := []error{errSigMissing, errSigMalformed, errSigStale, errSigFuture, errSigMismatch}
		if err != nil && !slicesContains(known, err) {
			t.Fatalf("unknown refusal %v", err)
		}
		if want := oracleAccepts(header, body, secrets, now); (err == nil) != want {
			t.Fatalf("VerifySignature(%q) = %v, oracle accepts: %v", header, err, want)
		}

		// A header made by Sign: accepted exactly inside the window.
		offset %= int64(2 * time.Hour / time.Second)
		at := now.Add(time.Duration(offset) * time.Second)
		err = VerifySignature(Sign(body, at, secrets[offset&1]), body, secrets, now)
		switch d := time.Duration(offset) * time.Second; {
		case at.Unix() <= 0:
			if !errors.Is(err, errSigMalformed) {
				t.Fatalf("timestamp %d: %v", at.Unix(), err)
			}
		case d < -SignatureMaxAge:
			if !errors.Is(err, errSigStale) {
				t.Fatalf("offset %v: %v, want stale", d, err)
			}
		case d > SignatureFutureSkew:
			if !errors.Is(err, errSigFuture) {
				t.Fatalf("offset %v: %v, want future", d, err)
			}
		default:
			if err != nil {
				t.Fatalf("offset %v: %v, want accepted", d, err)
			}
			// The same signature over another body is a mismatch.
			if err := VerifySignature(Sign(body, at, secrets[0]), append(bytes.Clone(body), ' '), secrets, now); !errors.Is(err, errSigMismatch) {
				t.Fatalf("other body: %v, want mismatch", err)
			}
		}
	})
}

func slicesContains(errs []error, err error) bool {
	for _, e := range errs {
		if e == err {
			return true
		}
	}
	return false
}

// oracleAccepts is what the header scheme allows, written without the parser's code.
func oracleAccepts(header string, body []byte, secrets [][]byte, now time.Time) bool {
	if header == "" {
		return false
	}
	var ts []string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return false
		}
		switch k {
		case "t":
			ts = append(ts, v)
		case "v1":
			if b, err := hex.DecodeString(v); err == nil && len(b) == 32 {
				sigs = append(sigs, b)
			}
		}
	}
	if len(ts) != 1 || len(sigs) == 0 || len(sigs) > maxSignatures {
		return false
	}
	unix, err := strconv.ParseInt(ts[0], 10, 64)
	if err != nil || unix <= 0 || strconv.FormatInt(unix, 10) != ts[0] {
		return false
	}
	at := time.Unix(unix, 0)
	if now.Sub(at) > SignatureMaxAge || at.Sub(now) > SignatureFutureSkew {
		return false
	}
	for _, s := range secrets {
		for _, sig := range sigs {
			if hmac.Equal(sig, mac(s, ts[0], body)) {
				return true
			}
		}
	}
	return false
}
