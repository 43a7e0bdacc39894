package apiclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error is an API error answer: the contract's ErrorResponse envelope and its status.
type Error struct {
	Status        int
	Code          string
	Message       string
	CorrelationID string
	Reason        string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	if e.Message == "" {
		b.WriteString(http.StatusText(e.Status))
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	fmt.Fprintf(&b, "\n  code: %s", e.Code)
	if e.CorrelationID != "" {
		fmt.Fprintf(&b, "\n  correlation id: %s", e.CorrelationID)
	}
	return b.String()
}

// Check turns a non-2xx answer into an *Error. A body that is not the envelope (a proxy's
// page, say) still gives the status and the X-Request-Id header.
func Check(status int, header http.Header, body []byte) error {
	if status >= 200 && status < 300 {
		return nil
	}
	var env struct {
		Code          string         `json:"code"`
		Message       string         `json:"message"`
		CorrelationID string         `json:"correlation_id"`
		Details       map[string]any `json:"details"`
		// The token endpoint answers as OAuth 2.0 (RFC 6749 §5.2) does.
		OAuthError       string `json:"error"`
		OAuthDescription string `json:"error_description"`
	}
	e := &Error{Status: status}
	if json.Unmarshal(body, &env) == nil && env.Code != "" {
		e.Code, e.Message, e.CorrelationID = env.Code, env.Message, env.CorrelationID
		if r, ok := env.Details["reason"].(string); ok {
			e.Reason = r
		}
	} else if json.Unmarshal(body, &env) == nil && env.OAuthError != "" {
		e.Code, e.Message = env.OAuthError, env.OAuthDescription
	} else {
		e.Code = "http_" + fmt.Sprint(status)
		e.Message = strings.TrimSpace(string(body))
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "..."
		}
	}
	if e.CorrelationID == "" && header != nil {
		e.CorrelationID = header.Get("X-Request-Id")
	}
	return e
}

// ErrNotLoggedIn: the profile holds no login.
var ErrNotLoggedIn = errors.New("not logged in")

// LoginExpiredError: the stored login can no longer be refreshed (expired, revoked, or
// the user signed out elsewhere). It carries the API's answer when there was one.
type LoginExpiredError struct {
	Profile string
	Cause   error
}

func (e *LoginExpiredError) Error() string {
	msg := "your login has expired or was revoked"
	var ae *Error
	if errors.As(e.Cause, &ae) {
		msg += fmt.Sprintf(" (%s", ae.Code)
		if ae.CorrelationID != "" {
			msg += ", correlation id " + ae.CorrelationID
		}
		msg += ")"
	}
	return msg
}

func (e *LoginExpiredError) Unwrap() error { return e.Cause }
