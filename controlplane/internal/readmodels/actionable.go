package readmodels

import (
	"strconv"
	"time"
)

// Recovery conditions: statuses after which a person has to act (retry a release, look
// at a failed restart or launch). Each is actionable for a window after the workload
// entered it, then ages into history but keeps action_required (docs/operations.md,
// "Workloads").
const (
	ConditionReleaseFailed = "release_failed"
	ConditionRestartFailed = "restart_failed"
	ConditionFailed        = "failed"
)

// Windows are how long each recovery condition stays in live attention surfaces.
type Windows struct {
	ReleaseFailed time.Duration
	RestartFailed time.Duration
	Failed        time.Duration
}

// DefaultWindows: a failed release still holds the node (and may still bill nothing but
// block capacity) so it stays actionable longest; a failed launch holds nothing.
var DefaultWindows = Windows{ReleaseFailed: 72 * time.Hour, RestartFailed: 72 * time.Hour, Failed: 24 * time.Hour}

func (w Windows) withDefaults() Windows {
	if w.ReleaseFailed <= 0 {
		w.ReleaseFailed = DefaultWindows.ReleaseFailed
	}
	if w.RestartFailed <= 0 {
		w.RestartFailed = DefaultWindows.RestartFailed
	}
	if w.Failed <= 0 {
		w.Failed = DefaultWindows.Failed
	}
	return w
}

// window is the actionable window of status, and false when status is no recovery
// condition.
func (w Windows) window(status string) (time.Duration, bool) {
	switch status {
	case ConditionReleaseFailed:
		return w.ReleaseFailed, true
	case ConditionRestartFailed:
		return w.RestartFailed, true
	case ConditionFailed:
		return w.Failed, true
	}
	return 0, false
}

// endedStatuses hold nothing and need nothing: history once there (a failed one is
// history when its window has passed).
var endedStatuses = []string{"released", "completed", "failed"}

// Action is what the server derives about a workload's recovery condition at now.
type Action struct {
	Required   bool       // a recovery condition holds, aged or not
	Actionable bool       // it shows in the caller's live attention surfaces now
	Until      *time.Time // since + the condition's window (nil without a condition)
	Reason     string     // the condition ("" without one)
	Key        string     // the attention key ("" without a condition)
	Live       bool       // listed under scope=live
}

// Derive computes a workload's action state with control-plane time now: status and
// since (when it entered status), whether the caller dismissed its attention item, and
// the workload id the key is built from. The key names the condition and when it
// began, so a new failure of the same workload is a new item that a past dismissal does
// not hide.
func (w Windows) Derive(workloadID, status string, since, now time.Time, dismissed bool) Action {
	win, ok := w.window(status)
	if !ok {
		live := true
		for _, s := range endedStatuses {
			if s == status {
				live = false
			}
		}
		return Action{Live: live}
	}
	until := since.Add(win).UTC()
	inWindow := now.Before(until)
	return Action{
		Required:   true,
		Actionable: inWindow && !dismissed,
		Until:      &until,
		Reason:     status,
		Key:        AttentionKey(workloadID, status, since),
		Live:       inWindow,
	}
}

// AttentionKey is the attention key of a workload's condition that began at since:
// "<workload id>.<condition>.<unix millis>" (seed 4.1 pattern).
func AttentionKey(workloadID, condition string, since time.Time) string {
	return workloadID + "." + condition + "." + strconv.FormatInt(since.UnixMilli(), 10)
}
