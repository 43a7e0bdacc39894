package apierr

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestEveryCodeHasAStatus(t *testing.T) {
	if len(All) != 42 {
		t.Fatalf("seed §7.2 has 42 codes, All has %d", len(All))
	}
	for _, c := range All {
		s := c.HTTPStatus()
		switch {
		case strings.HasPrefix(string(c), "token_"):
			if s != 401 {
				t.Errorf("%s -> %d, want 401", c, s)
			}
		case strings.HasSuffix(string(c), "_not_found"):
			if s != 404 {
				t.Errorf("%s -> %d, want 404", c, s)
			}
		case strings.HasSuffix(string(c), "_already_exists"):
			if s != 409 {
				t.Errorf("%s -> %d, want 409", c, s)
			}
		case c == InternalError:
			if s != 500 {
				t.Errorf("%s -> %d", c, s)
			}
		case s == 500:
			t.Errorf("%s has no status of its own", c)
		}
	}
	for c, want := range map[Code]int{ValidationError: 422, InvalidRequest: 400, RateLimitExceeded: 429,
		InsufficientBalance: 402, SKUUnavailable: 409, AdminRequired: 403, UpstreamError: 502, ServiceUnavailable: 503} {
		if got := c.HTTPStatus(); got != want {
			t.Errorf("%s -> %d, want %d", c, got, want)
		}
	}
}

func TestWriteHidesCausesAndInternalText(t *testing.T) {
	w := Writer{Service: "svc"}
	rec := httptest.NewRecorder()
	w.Write(rec, httptest.NewRequest("GET", "/", nil), errors.New("pq: password authentication failed for user x"))
	var env Envelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 500 || env.Code != InternalError || strings.Contains(rec.Body.String(), "password") || env.Details["service"] != "svc" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	w.Write(rec, httptest.NewRequest("GET", "/", nil), New(RateLimitExceeded, "slow down").WithRetryAfter(1500e6).Wrap(errors.New("redis says hi")))
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || strings.Contains(rec.Body.String(), "redis") {
		t.Fatalf("%d %q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}
