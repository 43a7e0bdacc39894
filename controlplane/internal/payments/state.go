package payments

// Status is a payment's state.
type Status string

const (
	StatusCreated           Status = "created"
	StatusPending           Status = "pending"
	StatusSucceeded         Status = "succeeded"
	StatusPartiallyRefunded Status = "partially_refunded"
	StatusRefunded          Status = "refunded"
	StatusFailed            Status = "failed"
	StatusCanceled          Status = "canceled"
)

// transitions is the one table of allowed moves. Anything not listed (a late or
// out-of-order event asking to go backwards, or sideways out of a final state) is
// ignored, never applied.
//
// failed -> succeeded is allowed on purpose: with a Stripe-style provider a declined card
// fails the attempt, the customer may retry on the same payment object, and money that
// was captured must always be credited. canceled and refunded are final.
var transitions = map[Status][]Status{
	StatusCreated:           {StatusPending, StatusSucceeded, StatusFailed, StatusCanceled},
	StatusPending:           {StatusSucceeded, StatusFailed, StatusCanceled},
	StatusFailed:            {StatusSucceeded},
	StatusSucceeded:         {StatusPartiallyRefunded, StatusRefunded},
	StatusPartiallyRefunded: {StatusPartiallyRefunded, StatusRefunded},
	StatusRefunded:          {},
	StatusCanceled:          {},
}

// CanMove reports whether a payment in from may move to to.
func CanMove(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Captured reports whether a payment in s holds captured money (refundable states).
func (s Status) Captured() bool {
	return s == StatusSucceeded || s == StatusPartiallyRefunded || s == StatusRefunded
}

// refundStatus is the state after refunding so that refunded of captured is refunded.
func refundStatus(captured, refunded int64) Status {
	if refunded >= captured {
		return StatusRefunded
	}
	return StatusPartiallyRefunded
}
