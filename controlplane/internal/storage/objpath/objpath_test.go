package objpath

import (
	"errors"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// fromQuery decodes a value the way the HTTP layer does (net/url, once), so each case is
// written exactly as a client would put it on the wire after "?path=".
func fromQuery(t *testing.T, wire string) string {
	t.Helper()
	q, err := url.ParseQuery("path=" + wire)
	if err != nil {
		t.Fatalf("bad test case %q: %v", wire, err)
	}
	return q.Get("path")
}

// traversalSpellings are the ways a client can try to leave the bucket root. Every one
// must be ErrTraversal.
var traversalSpellings = []string{
	"..",
	"../etc/passwd",
	"a/../../b",
	"a/b/../../..",
	"./../x",
	"a/./../../x",
	".../../..",
	"/etc/passwd",
	"//server/share",
	"%2e%2e/x",             // "../x" after the HTTP decode
	"%2e%2e%2fx",           // "../x", the slash encoded too
	"..%2f..%2fetc",        // "../../etc"
	"%2e./x",               // half-encoded dot segment
	".%2e/x",               // the other half
	"%2fetc",               // "/etc"
	"%252e%252e%252fetc",   // double-encoded "../etc"
	"%25252e%25252e/x",     // triple-encoded ".."
	"..%252fx",             // double-encoded slash: "..%2fx" is "../x" one decode later
	"%252fetc",             // double-encoded leading slash
	"a/%252e%252e",         // double-encoded ".." even inside the root: only attackers do that
	"..\\..\\x",            // backslash separators
	"..%5c..%5cwindows",    // encoded backslashes
	"a/..\\..\\b",          // mixed slashes
	"..%2f..\\x",           // mixed, partly encoded
	"%5c..%5cx",            // leading backslash: absolute
	"C:%5cWindows",         // drive-absolute
	"c:/x",                 // drive-absolute with a slash
	"a%00b",                // NUL
	"x/%00",                // NUL as an element
	"x%0a",                 // newline
	"%7f",                  // DEL
	"%c2%85",               // NEL, a C1 control
	"%ff",                  // invalid UTF-8
	"%c0%ae%c0%ae/x",       // overlong UTF-8 "..": invalid UTF-8
	"%25c0%25ae%25c0%25ae", // the same, double-encoded
	"%ef%bc%8e%ef%bc%8e/x", // FULLWIDTH FULL STOP x2, NFKC ".."
	"%e2%80%a5/x",          // TWO DOT LEADER
	"a/%e2%80%a4%e2%80%a4", // ONE DOT LEADER x2
	"%252500",              // NUL, triple-encoded
}

func TestCleanRefusesTraversal(t *testing.T) {
	if len(traversalSpellings) < 25 {
		t.Fatalf("the issue asks for at least 25 spellings, have %d", len(traversalSpellings))
	}
	for _, wire := range traversalSpellings {
		raw := fromQuery(t, wire)
		got, err := Clean(raw)
		if !errors.Is(err, ErrTraversal) {
			t.Errorf("Clean(%q) (wire %q) = %q, %v; want ErrTraversal", raw, wire, got, err)
		}
		if _, err := CleanPrefix(raw); !errors.Is(err, ErrTraversal) {
			t.Errorf("CleanPrefix(%q) (wire %q) = %v; want ErrTraversal", raw, wire, err)
		}
	}
}

func TestCleanCanonicalises(t *testing.T) {
	for _, tc := range []struct{ wire, want string }{
		{"a", "a"},
		{"a/b/c.txt", "a/b/c.txt"},
		{"a/./b", "a/b"},
		{"a//b", "a/b"},
		{"a/b/", "a/b"},
		{"./a", "a"},
		{"a/../b", "b"},
		{"a/b/../../c", "c"},
		{"a\\b", "a/b"},
		{"a%5cb", "a/b"},
		{"100%25.txt", "100%.txt"},
		{"100%25/%2e%2ex", "100%/..x"},
		{"...", "..."},
		{"..a/a..", "..a/a.."},
		{"%e6%97%a5%e6%9c%ac/%e3%83%95", "日本/フ"},
		{"a%252Fb", "a%2Fb"}, // decodes to "a/b" one layer down: inside the root, kept literally
		{"%25zz", "%zz"},
		{"x:y/c:", "x:y/c:"},
		{"checkpoints/step-100.pt", "checkpoints/step-100.pt"},
	} {
		raw := fromQuery(t, tc.wire)
		got, err := Clean(raw)
		if err != nil || got != tc.want {
			t.Errorf("Clean(%q) = %q, %v; want %q", raw, got, err, tc.want)
		}
	}
}

func TestCleanEmptyAndTooLong(t *testing.T) {
	for _, raw := range []string{"", ".", "./", "a/..", "a/b/../.."} {
		if got, err := Clean(raw); !errors.Is(err, ErrEmpty) {
			t.Errorf("Clean(%q) = %q, %v; want ErrEmpty", raw, got, err)
		}
	}
	ok := strings.Repeat("a/", MaxLen/2-1) + "bb"
	if len(ok) != MaxLen {
		t.Fatalf("test setup: %d bytes", len(ok))
	}
	if got, err := Clean(ok); err != nil || got != ok {
		t.Errorf("Clean of exactly %d bytes: %v", MaxLen, err)
	}
	for _, raw := range []string{ok + "c", strings.Repeat("../", 400)} {
		if _, err := Clean(raw); !errors.Is(err, ErrTooLong) || errors.Is(err, ErrTraversal) {
			t.Errorf("Clean of %d bytes = %v; want ErrTooLong", len(raw), err)
		}
		if _, err := CleanPrefix(raw); !errors.Is(err, ErrTooLong) {
			t.Errorf("CleanPrefix of %d bytes = %v; want ErrTooLong", len(raw), err)
		}
	}
}

func TestCleanPrefix(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"", ""},
		{"a", "a"},
		{"a/", "a/"},
		{"a/b/", "a/b/"},
		{"a//b//", "a/b/"},
		{"a\\b\\", "a/b/"},
		{"a/./", "a/"},
		{"a/.", "a"},
		{"a/../", ""},
		{".", ""},
		{"./", ""},
		{"da", "da"},
	} {
		got, err := CleanPrefix(tc.raw)
		if err != nil || got != tc.want {
			t.Errorf("CleanPrefix(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
		}
	}
	for _, raw := range []string{"/", "/a", "../", "..", "a/../../"} {
		if got, err := CleanPrefix(raw); !errors.Is(err, ErrTraversal) {
			t.Errorf("CleanPrefix(%q) = %q, %v; want ErrTraversal", raw, got, err)
		}
	}
}

func TestValidBucketID(t *testing.T) {
	long := strings.Repeat("b", 128)
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"datasets", true},
		{"team-a/imagenet:v2_final.1", true},
		{long, true},
		{"a.b..c", true}, // ".." inside an element is just a name
		{"a/...", true},
		{long + "b", false},
		{"", false},
		{"-a", false},
		{".a", false},
		{"/a", false},
		{"a/..", false},
		{"a/../b", false},
		{"a/./b", false},
		{"a/.", false},
		{"a//b", false},
		{"a/", false},
		{"a b", false},
		{"a\\b", false},
		{"a%2e", false},
		{"ä", false},
		{"a\x00", false},
	} {
		if got := ValidBucketID(tc.id); got != tc.ok {
			t.Errorf("ValidBucketID(%q) = %v, want %v", tc.id, got, tc.ok)
		}
	}
}

// checkCanonical fails the test unless out has the canonical form Clean promises.
func checkCanonical(t *testing.T, raw, out string) {
	t.Helper()
	if out == "" || len(out) > MaxLen {
		t.Fatalf("Clean(%q) = %q: empty or too long", raw, out)
	}
	if strings.HasPrefix(out, "/") || strings.Contains(out, "\\") || !utf8.ValidString(out) {
		t.Fatalf("Clean(%q) = %q: absolute, backslash or invalid UTF-8", raw, out)
	}
	for _, e := range strings.Split(out, "/") {
		if e == "" || e == "." || e == ".." {
			t.Fatalf("Clean(%q) = %q: element %q", raw, out, e)
		}
	}
	for _, r := range out {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			t.Fatalf("Clean(%q) = %q: control character", raw, out)
		}
	}
	const root = "/srv/bucket"
	if j := path.Join(root, out); !strings.HasPrefix(j, root+"/") {
		t.Fatalf("Clean(%q) = %q escapes: %q", raw, out, j)
	}
	if j := filepath.Join(root, out); !strings.HasPrefix(j, root+"/") {
		t.Fatalf("Clean(%q) = %q escapes: %q", raw, out, j)
	}
	if d, _ := percentDecode(out); strings.HasPrefix(path.Clean(strings.ReplaceAll(d, "\\", "/"))+"/", "../") {
		t.Fatalf("Clean(%q) = %q escapes once decoded", raw, out)
	}
	again, err := Clean(out)
	if err != nil || again != out {
		t.Fatalf("Clean is not idempotent: Clean(%q) = %q, Clean(%q) = %q, %v", raw, out, out, again, err)
	}
	if p, err := CleanPrefix(out); err != nil || p != out {
		t.Fatalf("CleanPrefix(%q) = %q, %v; want it unchanged", out, p, err)
	}
}

func TestCleanResultsAreCanonical(t *testing.T) {
	for _, tc := range []string{"a/./b", "a\\b", "x/../y/", "100%25", "a%252Fb"} {
		raw := fromQuery(t, tc)
		out, err := Clean(raw)
		if err != nil {
			t.Fatalf("Clean(%q): %v", raw, err)
		}
		checkCanonical(t, raw, out)
	}
}

// FuzzClean: whatever the input, a result never escapes the root, is never absolute, has
// the canonical form and is a fixed point of Clean; a refusal is one of the three errors.
func FuzzClean(f *testing.F) {
	for _, s := range traversalSpellings {
		if q, err := url.ParseQuery("path=" + s); err == nil {
			f.Add(q.Get("path"))
		}
		f.Add(s)
	}
	for _, s := range []string{"a", "a/b", "a/../b", "100%", "%", "%2", "...", "a\\b\\..", "ｂ/．"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		out, err := Clean(raw)
		if err != nil {
			if !errors.Is(err, ErrTraversal) && !errors.Is(err, ErrTooLong) && !errors.Is(err, ErrEmpty) {
				t.Fatalf("Clean(%q): unexpected error %v", raw, err)
			}
			return
		}
		checkCanonical(t, raw, out)
	})
}
