package payments_test

import (
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
)

// TestTransitionTable walks every (from, to) pair: the allowed moves are exactly the
// forward ones, and nothing leaves refunded or canceled.
func TestTransitionTable(t *testing.T) {
	all := []payments.Status{
		payments.StatusCreated, payments.StatusPending, payments.StatusSucceeded, payments.StatusPartiallyRefunded,
		payments.StatusRefunded, payments.StatusFailed, payments.StatusCanceled,
	}
	allowed := map[[2]payments.Status]bool{
		{payments.StatusCreated, payments.StatusPending}:                     true,
		{payments.StatusCreated, payments.StatusSucceeded}:                   true,
		{payments.StatusCreated, payments.StatusFailed}:                      true,
		{payments.StatusCreated, payments.StatusCanceled}:                    true,
		{payments.StatusPending, payments.StatusSucceeded}:                   true,
		{payments.StatusPending, payments.StatusFailed}:                      true,
		{payments.StatusPending, payments.StatusCanceled}:                    true,
		{payments.StatusFailed, payments.StatusSucceeded}:                    true, // a retried attempt captured
		{payments.StatusSucceeded, payments.StatusPartiallyRefunded}:         true,
		{payments.StatusSucceeded, payments.StatusRefunded}:                  true,
		{payments.StatusPartiallyRefunded, payments.StatusPartiallyRefunded}: true,
		{payments.StatusPartiallyRefunded, payments.StatusRefunded}:          true,
	}
	for _, from := range all {
		for _, to := range all {
			if got, want := payments.CanMove(from, to), allowed[[2]payments.Status{from, to}]; got != want {
				t.Errorf("CanMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
	for _, s := range all {
		want := s == payments.StatusSucceeded || s == payments.StatusPartiallyRefunded || s == payments.StatusRefunded
		if s.Captured() != want {
			t.Errorf("%s.Captured() = %v", s, s.Captured())
		}
	}
}
