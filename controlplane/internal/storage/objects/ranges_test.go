package objects

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestParseRange(t *testing.T) {
	const size = 1000
	for _, c := range []struct {
		header      string
		ok          bool
		off, n      int64
		unsatisfied bool
	}{
		{"", false, 0, 0, false},
		{"bytes=0-0", true, 0, 1, false},
		{"bytes=0-99", true, 0, 100, false},
		{"bytes=100-199", true, 100, 100, false},
		{"bytes=990-", true, 990, 10, false},
		{"bytes=990-5000", true, 990, 10, false},
		{"bytes=-10", true, 990, 10, false},
		{"bytes=-5000", true, 0, 1000, false},
		{"bytes=999-999", true, 999, 1, false},
		{"bytes=1000-", false, 0, 0, true},
		{"bytes=1000-2000", false, 0, 0, true},
		{"bytes=-0", false, 0, 0, true},
		{"bytes=5-1", false, 0, 0, false},                   // invalid: ignored
		{"bytes=0-1,5-6", false, 0, 0, false},               // several ranges: whole object
		{"items=0-1", false, 0, 0, false},                   // unknown unit
		{"bytes=+1-2", false, 0, 0, false},                  // not digits
		{"bytes= 1 - 2", false, 0, 0, false},                // spaces inside
		{"bytes=-", false, 0, 0, false},                     // nothing
		{"bytes=99999999999999999999-", false, 0, 0, false}, // overflow
	} {
		r, ok, err := parseRange(c.header, size)
		if c.unsatisfied {
			var e *apierr.Error
			if !errors.As(err, &e) || e.HTTPStatus() != http.StatusRequestedRangeNotSatisfiable {
				t.Errorf("%q: err %v, want 416", c.header, err)
			}
			continue
		}
		if err != nil || ok != c.ok || (ok && (r.Off != c.off || r.N != c.n)) {
			t.Errorf("%q: %+v %v %v, want off %d n %d ok %v", c.header, r, ok, err, c.off, c.n, c.ok)
		}
	}
	if _, _, err := parseRange("bytes=0-", 0); err == nil {
		t.Error("a range of an empty object is satisfiable")
	}
	if got := contentRange(byteRange{Off: 10, N: 5}, 100); got != "bytes 10-14/100" {
		t.Errorf("content range %q", got)
	}
}

func TestPreconditions(t *testing.T) {
	const tag = `"abc"`
	mod := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	for _, c := range []struct {
		name   string
		p      Preconditions
		exists bool
		read   bool
		want   outcome
	}{
		{"none", Preconditions{}, true, true, proceed},
		{"if-match hit", Preconditions{IfMatch: `"x", "abc"`}, true, true, proceed},
		{"if-match miss", Preconditions{IfMatch: `"x"`}, true, true, preconditionFailed},
		{"if-match weak", Preconditions{IfMatch: `W/"abc"`}, true, false, preconditionFailed},
		{"if-match star absent", Preconditions{IfMatch: "*"}, false, false, preconditionFailed},
		{"if-match star present", Preconditions{IfMatch: "*"}, true, false, proceed},
		{"inm hit read", Preconditions{IfNoneMatch: `W/"abc"`}, true, true, notModified},
		{"inm miss read", Preconditions{IfNoneMatch: `"zzz"`}, true, true, proceed},
		{"inm star write", Preconditions{IfNoneMatch: "*"}, true, false, alreadyExists},
		{"inm star write absent", Preconditions{IfNoneMatch: "*"}, false, false, proceed},
		{"inm tag write", Preconditions{IfNoneMatch: tag}, true, false, preconditionFailed},
		{"ims not modified", Preconditions{IfModifiedSince: mod.Format(http.TimeFormat)}, true, true, notModified},
		{"ims modified", Preconditions{IfModifiedSince: mod.Add(-time.Hour).Format(http.TimeFormat)}, true, true, proceed},
		{"ims ignored with inm", Preconditions{IfNoneMatch: `"zzz"`, IfModifiedSince: mod.Format(http.TimeFormat)}, true, true, proceed},
	} {
		if got := c.p.evaluate(c.exists, tag, mod, c.read); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if !(Preconditions{IfRange: tag}).rangeApplies(tag, mod) || (Preconditions{IfRange: `"old"`}).rangeApplies(tag, mod) ||
		(Preconditions{IfRange: "W/" + tag}).rangeApplies(tag, mod) || !(Preconditions{IfRange: mod.Format(http.TimeFormat)}).rangeApplies(tag, mod) {
		t.Error("If-Range")
	}
}
