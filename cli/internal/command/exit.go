package command

import (
	"context"
	"errors"
	"net/http"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
)

// Exit codes (documented in `gantry --help` and docs/cli.md).
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitAuth        = 3
	ExitDenied      = 4
	ExitNotFound    = 5
	ExitConflict    = 6
	ExitInvalid     = 7
	ExitLimit       = 8
	ExitUnavailable = 9
	ExitFailed      = 10
	ExitInterrupted = 130
)

// exitError carries an exit code; quiet ones have printed their own message.
type exitError struct {
	code  int
	err   error
	quiet bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return "exit status"
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func usageErr(err error) error    { return &exitError{code: ExitUsage, err: err} }
func notFoundErr(err error) error { return &exitError{code: ExitNotFound, err: err} }

// exitCode maps an error to the documented exit codes: API errors by HTTP status (the
// contract fixes each code's status), the CLI's own by kind.
func exitCode(err error) int {
	var ex *exitError
	if errors.As(err, &ex) {
		return ex.code
	}
	var le *apiclient.LoginExpiredError
	if errors.Is(err, apiclient.ErrNotLoggedIn) || errors.As(err, &le) {
		return ExitAuth
	}
	if errors.Is(err, context.Canceled) {
		return ExitInterrupted
	}
	var ae *apiclient.Error
	if errors.As(err, &ae) {
		switch s := ae.Status; {
		case s == http.StatusUnauthorized:
			return ExitAuth
		case s == http.StatusForbidden:
			return ExitDenied
		case s == http.StatusNotFound:
			return ExitNotFound
		case s == http.StatusConflict:
			return ExitConflict
		case s == http.StatusBadRequest || s == http.StatusUnprocessableEntity || s == http.StatusRequestEntityTooLarge:
			return ExitInvalid
		case s == http.StatusPaymentRequired || s == http.StatusTooManyRequests:
			return ExitLimit
		case s >= 500:
			return ExitUnavailable
		}
	}
	return ExitError
}

// hintFor says what to do next where there is one obvious step.
func hintFor(err error) string {
	var le *apiclient.LoginExpiredError
	switch {
	case errors.As(err, &le):
		if le.Profile != "" && le.Profile != "default" {
			return "run `gantry login --profile " + le.Profile + "` to sign in again"
		}
		return "run `gantry login` to sign in again"
	case errors.Is(err, apiclient.ErrNotLoggedIn):
		return "run `gantry login --url URL` first"
	}
	var ae *apiclient.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case "token_expired", "token_invalid":
			if ae.Reason == "mfa_required" {
				return "this account has TOTP enabled: pass --totp CODE (or answer the prompt)"
			}
			return "run `gantry login` to sign in again"
		case "auth_enterprise_required", "auth_personal_disabled":
			// The answer does not name the organization: the user knows its sign-in name.
			return "this account signs in through its organization's identity provider: run `gantry login --sso ORGANIZATION`"
		case "node_offline":
			return "the allocation's node is offline; try again when it is back (gantry alloc get)"
		case "allocation_not_active":
			return "the allocation is not active (gantry alloc get shows its status)"
		case "insufficient_balance":
			return "top up the tenant's balance (gantry balance)"
		}
	}
	return ""
}
