package apierr

import (
	"errors"
	"fmt"
	"time"
)

// Error is an error with a contract code. Message is shown to the client and must be
// user-safe; Cause is for logs only.
type Error struct {
	Code    Code
	Message string
	Details map[string]any
	// Status overrides the code's status where the contract says so (a denied node
	// probe target is 400 whatever its code).
	Status     int
	RetryAfter time.Duration
	Cause      error
}

// New returns an error with the given code and a user-safe message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// With adds one details field and returns the error for chaining.
func (e *Error) With(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// Wrap records a cause for logs; the client never sees it.
func (e *Error) Wrap(cause error) *Error { e.Cause = cause; return e }

// WithStatus overrides the status of the code (only where the contract says so).
func (e *Error) WithStatus(status int) *Error { e.Status = status; return e }

// WithRetryAfter asks the writer to send a Retry-After header.
func (e *Error) WithRetryAfter(d time.Duration) *Error { e.RetryAfter = d; return e }

// HTTPStatus is the status this error is answered with.
func (e *Error) HTTPStatus() int {
	if e.Status != 0 {
		return e.Status
	}
	return e.Code.HTTPStatus()
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Cause)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Cause }

// As finds an *Error in err's chain.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// CodeOf is the code of err, internal_error when err carries none.
func CodeOf(err error) Code {
	if e, ok := As(err); ok {
		return e.Code
	}
	return InternalError
}

// Shorthands for the codes every feature uses.

func Validation(field, format string, args ...any) *Error {
	return New(ValidationError, format, args...).With("field", field)
}

func NotFound(code Code, what string) *Error { return New(code, "%s not found", what) }

func Forbidden(format string, args ...any) *Error {
	return New(InsufficientPermissions, format, args...)
}

func Internal(cause error) *Error {
	return &Error{Code: InternalError, Message: "internal error", Cause: cause}
}
