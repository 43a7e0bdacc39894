package audit_test

import "errors"

func errorAs[T any](err error, target *T) bool { return errors.As(err, target) }
