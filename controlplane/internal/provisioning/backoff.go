package provisioning

import "time"

// backoff is the delay before delivery attempt+1 of an undelivered task: minD doubling
// per attempt (attempt counts from 1) up to maxD, with jitter drawn from [d/2, d]
// (rnd in [0,1)) so that the tasks of a node that went offline do not come back in step.
func backoff(attempt int, minD, maxD time.Duration, rnd float64) time.Duration {
	d := minD
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	return d/2 + time.Duration(rnd*float64(d/2))
}

// retryDelay is backoff bounded by the task's deadline: the message comes back no later
// than the deadline, so the timeout is applied on time rather than up to a backoff late.
func retryDelay(attempt int, minD, maxD time.Duration, rnd float64, now, deadline time.Time) time.Duration {
	d := backoff(attempt, minD, maxD, rnd)
	if until := deadline.Sub(now); until < d {
		d = max(until, 10*time.Millisecond)
	}
	return d
}
