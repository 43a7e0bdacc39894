package ci

import (
	"errors"
	"testing"
)

// fakeT records how a test ended without ending the real one.
type fakeT struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Skipf(format string, args ...any) {
	f.skipped = true
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
}

func TestSkipUnlessAvailable(t *testing.T) {
	for _, tc := range []struct {
		ci         string
		err        error
		skip, fail bool
	}{
		{ci: "", err: nil},
		{ci: "true", err: nil},
		{ci: "", err: errors.New("not installed"), skip: true},
		{ci: "false", err: errors.New("not installed"), skip: true},
		{ci: "true", err: errors.New("not installed"), fail: true},
		{ci: "1", err: errors.New("not installed"), fail: true},
	} {
		t.Setenv("CI", tc.ci)
		f := &fakeT{}
		SkipUnlessAvailable(f, "promtool", tc.err)
		if f.skipped != tc.skip || f.failed != tc.fail {
			t.Errorf("CI=%q err=%v: skipped %v failed %v, want %v %v", tc.ci, tc.err, f.skipped, f.failed, tc.skip, tc.fail)
		}
	}
}
