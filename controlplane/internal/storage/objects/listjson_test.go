package objects

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gantry-gpu/gantry/proto/api"
)

// generated is what the generated response writes for body: status, headers, bytes.
func generated(t *testing.T, body api.StorageObjectListResponse, h api.ListStorageObjects200ResponseHeaders) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := (api.ListStorageObjects200JSONResponse{Body: body, Headers: h}).VisitListStorageObjectsResponse(rec); err != nil {
		t.Fatalf("generated response: %v", err)
	}
	return rec
}

func sameAnswer(t *testing.T, body api.StorageObjectListResponse, h api.ListStorageObjects200ResponseHeaders) {
	t.Helper()
	want := generated(t, body, h)
	got := httptest.NewRecorder()
	if err := (listAnswer{body: body, headers: h}).VisitListStorageObjectsResponse(got); err != nil {
		t.Fatalf("listAnswer: %v", err)
	}
	if got.Code != want.Code || !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
		t.Fatalf("listAnswer wrote %d %q\nthe generated response %d %q", got.Code, got.Body, want.Code, want.Body)
	}
	for _, k := range []string{"Content-Type", "X-Request-Id"} {
		if got.Header().Get(k) != want.Header().Get(k) || len(got.Header()) != len(want.Header()) {
			t.Fatalf("headers %v, the generated response's %v", got.Header(), want.Header())
		}
	}
}

// awkward is every string shape encoding/json escapes: each ASCII byte, HTML
// characters, the line and paragraph separators, invalid and truncated UTF-8, a NUL,
// multi-byte runes and emoji.
func awkward() []string {
	out := []string{"", "plain/path.bin", `quo"te`, `back\slash`, "<script>&amp;</script>", "line\u2028sep\u2029para",
		"bad\xffutf8", "trunc\xe2\x82", "nul\x00byte", "del\x7f", "é/ß/日本語/🚀", "\xed\xa0\x80surrogate", strings.Repeat("é", 300)}
	var all strings.Builder
	for c := range 0x80 {
		out = append(out, "a"+string(rune(c))+"z")
		all.WriteByte(byte(c))
	}
	return append(out, all.String())
}

// TestListAnswerMatchesGenerated: the hand-written listing answer is byte for byte the
// generated response's, for awkward paths, prefixes, content types and cursors, times
// in several zones and precisions, empty and null lists, with and without X-Request-Id.
func TestListAnswerMatchesGenerated(t *testing.T) {
	times := []time.Time{time.Date(2026, 11, 26, 1, 2, 3, 0, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 1000, time.FixedZone("x", 5*3600+30*60)), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("y", -7*3600)), time.Unix(1764118923, 500).Local()}
	strs := awkward()
	var objs []api.StorageObject
	for i, s := range strs {
		objs = append(objs, api.StorageObject{Path: s, ContentType: strs[(i+1)%len(strs)], Etag: `"` + strs[(i+2)%len(strs)] + `"`,
			SizeBytes: int64(i*7919) - 3, UpdatedAt: times[i%len(times)]})
	}
	rid := "req-<1>&\u2028"
	cursor := strs[len(strs)-1]
	cases := []api.StorageObjectListResponse{
		{Objects: []api.StorageObject{}, CommonPrefixes: []string{}, Pagination: api.Pagination{PageSize: 50}},
		{Pagination: api.Pagination{PageSize: 1}}, // nil lists: null
		{Objects: objs, CommonPrefixes: strs, Pagination: api.Pagination{PageSize: 200, NextCursor: &cursor}},
		{Objects: objs[:1], CommonPrefixes: []string{}, Pagination: api.Pagination{PageSize: -1}},
	}
	for _, c := range cases {
		sameAnswer(t, c, api.ListStorageObjects200ResponseHeaders{})
		sameAnswer(t, c, api.ListStorageObjects200ResponseHeaders{XRequestID: &rid})
	}
	// Random strings of arbitrary bytes, biased to the characters that escape.
	rng := rand.New(rand.NewPCG(20, 7))
	alphabet := []string{"a", "/", `"`, `\`, "<", ">", "&", "\n", "\t", "\x01", "\x1f", "\x7f", "\xff", "\xc3", "é", "\u2028", "\u2029", "🚀", "\xe2\x80"}
	for range 300 {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := b.String()
		sameAnswer(t, api.StorageObjectListResponse{Objects: []api.StorageObject{{Path: s, Etag: s, ContentType: s,
			UpdatedAt: time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)).UTC()}}, CommonPrefixes: []string{s}, Pagination: api.Pagination{NextCursor: &s}},
			api.ListStorageObjects200ResponseHeaders{})
	}
	if !utf8.ValidString(strs[10]) {
		t.Fatal("fixture")
	}
}

// TestListAnswerRefusesWhatEncodingJSONRefuses: a time outside years 0..9999 is the
// generated response's error, not a body encoding/json would never write.
func TestListAnswerRefusesWhatEncodingJSONRefuses(t *testing.T) {
	body := api.StorageObjectListResponse{Objects: []api.StorageObject{{Path: "a", UpdatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}}
	if err := (listAnswer{body: body}).VisitListStorageObjectsResponse(httptest.NewRecorder()); err == nil {
		t.Fatal("a year-10000 time was encoded")
	}
}

func BenchmarkListAnswer(b *testing.B) {
	objs := make([]api.StorageObject, 200)
	for i := range objs {
		objs[i] = api.StorageObject{Path: "run001/ckpt-000123.bin", Etag: `"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"`,
			ContentType: "application/octet-stream", SizeBytes: 1024, UpdatedAt: time.Now()}
	}
	c := "eyJhIjoicnVuMDAxL2NrcHQtMDAwMTIzLmJpbiJ9.sig"
	body := api.StorageObjectListResponse{Objects: objs, CommonPrefixes: []string{}, Pagination: api.Pagination{PageSize: 200, NextCursor: &c}}
	b.Run("generated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = api.ListStorageObjects200JSONResponse{Body: body}.VisitListStorageObjectsResponse(discard{})
		}
	})
	b.Run("listAnswer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = listAnswer{body: body}.VisitListStorageObjectsResponse(discard{})
		}
	})
}

// discard is a ResponseWriter that keeps nothing (the benchmark measures the encoding).
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}
