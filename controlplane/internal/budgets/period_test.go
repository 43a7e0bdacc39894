package budgets

import (
	"testing"
	"time"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestPeriodAt(t *testing.T) {
	end := at("2026-08-15T00:00:00Z")
	cases := []struct {
		name, period string
		starts       time.Time
		ends         *time.Time
		now          time.Time
		want         Window
		ok           bool
	}{
		{"monthly", PeriodMonthly, at("2026-01-01T00:00:00Z"), nil, at("2026-03-31T23:59:59Z"), Window{at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z")}, true},
		{"monthly first instant", PeriodMonthly, at("2026-01-01T00:00:00Z"), nil, at("2026-04-01T00:00:00Z"), Window{at("2026-04-01T00:00:00Z"), at("2026-05-01T00:00:00Z")}, true},
		{"monthly clipped to starts_at", PeriodMonthly, at("2026-03-10T12:00:00Z"), nil, at("2026-03-20T00:00:00Z"), Window{at("2026-03-10T12:00:00Z"), at("2026-04-01T00:00:00Z")}, true},
		{"monthly clipped to ends_at", PeriodMonthly, at("2026-01-01T00:00:00Z"), &end, at("2026-08-02T00:00:00Z"), Window{at("2026-08-01T00:00:00Z"), end}, true},
		{"at ends_at: none", PeriodMonthly, at("2026-01-01T00:00:00Z"), &end, end, Window{}, false},
		{"before starts_at: none", PeriodMonthly, at("2026-03-10T00:00:00Z"), nil, at("2026-03-09T23:59:59Z"), Window{}, false},
		{"quarterly Q3", PeriodQuarterly, at("2026-01-01T00:00:00Z"), nil, at("2026-09-30T10:00:00Z"), Window{at("2026-07-01T00:00:00Z"), at("2026-10-01T00:00:00Z")}, true},
		{"quarterly Q1", PeriodQuarterly, at("2026-01-01T00:00:00Z"), nil, at("2026-01-01T00:00:00Z"), Window{at("2026-01-01T00:00:00Z"), at("2026-04-01T00:00:00Z")}, true},
		{"annual", PeriodAnnual, at("2025-06-01T00:00:00Z"), nil, at("2026-12-31T23:00:00Z"), Window{at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:00Z")}, true},
		{"custom", PeriodCustom, at("2026-02-10T00:00:00Z"), &end, at("2026-05-01T00:00:00Z"), Window{at("2026-02-10T00:00:00Z"), end}, true},
		{"custom past its end", PeriodCustom, at("2026-02-10T00:00:00Z"), &end, at("2026-09-01T00:00:00Z"), Window{}, false},
		{"non-UTC now", PeriodMonthly, at("2026-01-01T00:00:00Z"), nil, at("2026-03-31T23:30:00-02:00"), Window{at("2026-04-01T00:00:00Z"), at("2026-05-01T00:00:00Z")}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := PeriodAt(tc.period, tc.starts, tc.ends, tc.now)
			if ok != tc.ok || !got.Start.Equal(tc.want.Start) || !got.End.Equal(tc.want.End) {
				t.Fatalf("PeriodAt = %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// The rule at the edges: a threshold is crossed, and a budget exhausted, at exactly the
// level (>=); one minor unit below is not.
func TestReachedEdges(t *testing.T) {
	cases := []struct {
		spent, amount int64
		percent       int
		want          bool
	}{
		{100_00, 100_00, 100, true}, // exactly 100 %: exhausted
		{99_99, 100_00, 100, false}, // 99.99 %: not
		{100_01, 100_00, 100, true}, // over
		{80_00, 100_00, 80, true},   // exactly threshold_percent: crossed
		{79_99, 100_00, 80, false},  // one cent below: not
		{2, 3, 67, false},           // 66.67 % < 67 %
		{201, 300, 67, true},        // 67 % exactly
		{0, 1, 1, false},            //
		{-5, 100, 1, false},         // net credits never cross
		{1 << 62, 1, 100, true},     // no overflow
		{1<<63 - 1, 1_000_000_000_000_000, 100, true},
	}
	for _, tc := range cases {
		if got := Reached(tc.spent, tc.amount, tc.percent); got != tc.want {
			t.Errorf("Reached(%d, %d, %d) = %v, want %v", tc.spent, tc.amount, tc.percent, got, tc.want)
		}
	}
}

func TestPercentUsed(t *testing.T) {
	cases := []struct{ spent, amount, want int64 }{
		{99_99, 100_00, 99}, {100_00, 100_00, 100}, {150_00, 100_00, 150}, {0, 7, 0}, {1, 3, 33}, {2, 3, 66},
		{-1, 100, -1}, {1<<63 - 1, 1, 1<<63 - 1},
	}
	for _, tc := range cases {
		if got := PercentUsed(tc.spent, tc.amount); got != tc.want {
			t.Errorf("PercentUsed(%d, %d) = %d, want %d", tc.spent, tc.amount, got, tc.want)
		}
	}
}

// judge is the decision table: notify_only never blocks; block_launch and suspend block
// once the projected spend reaches 100 % (exactly 100 % included).
func TestJudge(t *testing.T) {
	b := func(mode string) Budget {
		return Budget{AmountMinor: 100_00, ThresholdPercent: 80, EnforcementMode: mode}
	}
	cases := []struct {
		mode            string
		spent, proposed int64
		decision        string
		reason          string
	}{
		{ModeNotifyOnly, 0, 79_99, DecisionAllow, ReasonWithinBudget},
		{ModeNotifyOnly, 0, 80_00, DecisionWarn, ReasonThresholdCrossed},
		{ModeNotifyOnly, 50_00, 50_00, DecisionWarn, ReasonBudgetExceeded},
		{ModeNotifyOnly, 500_00, 1, DecisionWarn, ReasonBudgetExceeded},
		{ModeBlockLaunch, 50_00, 49_99, DecisionWarn, ReasonThresholdCrossed},
		{ModeBlockLaunch, 50_00, 50_00, DecisionWouldBlock, ReasonBudgetExceeded},
		{ModeBlockLaunch, 100_00, 0, DecisionWouldBlock, ReasonBudgetExceeded},
		{ModeBlockLaunch, 10_00, 0, DecisionAllow, ReasonWithinBudget},
		{ModeSuspend, 99_99, 1, DecisionWouldBlock, ReasonBudgetExceeded},
		{ModeSuspend, 99_98, 1, DecisionWarn, ReasonThresholdCrossed},
		{ModeSuspend, 1<<63 - 1, 1<<63 - 1, DecisionWouldBlock, ReasonBudgetExceeded}, // saturates, never wraps
	}
	for _, tc := range cases {
		d, r := judge(b(tc.mode), tc.spent, tc.proposed)
		if d != tc.decision || r != tc.reason {
			t.Errorf("%s spent %d + %d: %s/%s, want %s/%s", tc.mode, tc.spent, tc.proposed, d, r, tc.decision, tc.reason)
		}
	}
}

func TestTransitionsForwardOnly(t *testing.T) {
	order := map[string]int{StatusOpen: 0, StatusAcknowledged: 1, StatusResolved: 2}
	for from := range order {
		for to := range order {
			if got, want := CanMove(from, to), order[to] > order[from]; got != want {
				t.Errorf("CanMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestPermissionsTable(t *testing.T) {
	cases := []struct {
		scope, role  string
		read, manage bool
	}{
		{ScopeTenant, RoleTenantAdmin, true, true},
		{ScopeTenant, RoleTenantMember, true, false},
		{ScopeProject, "owner", true, true},
		{ScopeProject, "admin", true, true},
		{ScopeProject, "member", true, false},
		{ScopeProject, "viewer", true, false},
		{ScopeProject, "", false, false},
		{ScopeTenant, "owner", false, false},
	}
	for _, tc := range cases {
		if Can(tc.scope, tc.role, ActRead) != tc.read || Can(tc.scope, tc.role, ActManage) != tc.manage {
			t.Errorf("%s/%s: read %v manage %v, want %v %v", tc.scope, tc.role,
				Can(tc.scope, tc.role, ActRead), Can(tc.scope, tc.role, ActManage), tc.read, tc.manage)
		}
	}
}
