package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// Answer is an HTTP answer read whole and decoded as a JSON object, for tests that
// drive operations the generated client models poorly (form bodies, RFC 6749 errors,
// headers). Env's transport has already validated it against the contract.
type Answer struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

// Str is the string field k of the body ("" when absent or not a string).
func (a Answer) Str(k string) string { s, _ := a.Body[k].(string); return s }

// Code is the error envelope's code.
func (a Answer) Code() string { return a.Str("code") }

// Reason is the error envelope's details.reason.
func (a Answer) Reason() string {
	d, _ := a.Body["details"].(map[string]any)
	s, _ := d["reason"].(string)
	return s
}

// Send sends req through the validating client and reads the answer.
func (e *Env) Send(t testing.TB, req *http.Request) Answer {
	t.Helper()
	resp := e.Do(req)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := Answer{Status: resp.StatusCode, Header: resp.Header, Body: map[string]any{}, Raw: string(data)}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &a.Body); err != nil {
			t.Fatalf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, data)
		}
	}
	return a
}

// Call sends body (JSON-encoded when not nil) with token as the bearer and project as
// X-Project-ID when not empty.
func (e *Env) Call(t testing.TB, method, path, token string, body any, project string) Answer {
	t.Helper()
	var raw string
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		raw = string(b)
	}
	req := e.Request(method, path, token, raw)
	if project != "" {
		req.Header.Set("X-Project-ID", project)
	}
	return e.Send(t, req)
}

// Count runs a count query on the test database.
func (e *Env) Count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := e.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Oathtool is the code an authenticator app shows for secret at now, from oathtool
// (the RFC 6238 implementation Debian ships), so server and apps are checked to agree.
func Oathtool(t testing.TB, secret string, now time.Time) string {
	t.Helper()
	path, err := exec.LookPath("oathtool")
	ci.SkipUnlessAvailable(t, "oathtool (Debian package oathtool; .ci/run installs it)", err)
	out, err := exec.Command(path, "--totp", "--base32", "--now", now.UTC().Format("2006-01-02 15:04:05 UTC"), secret).Output()
	if err != nil {
		t.Fatalf("oathtool: %v", err)
	}
	return strings.TrimSpace(string(out))
}
