package runtime

import (
	"errors"

	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// Error is a failed runtime operation with the alloctask error code the control plane
// gets in TaskResult.error_code.
type Error struct {
	Code string // alloctask.Code*
	Err  error
}

func (e *Error) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func fail(code string, err error) error { return &Error{Code: code, Err: err} }

// Code returns err's alloctask code: the code of a runtime Error, else runtime_failed.
func Code(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return alloctask.CodeRuntimeFailed
}
