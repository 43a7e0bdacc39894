package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"
)

// FuzzPushDecode feeds arbitrary push bodies, in both of Loki's formats, to the decoders
// and then to stamping, as an enrolled node (or anyone holding a node token) can send
// them. Properties: no panic; every refusal is errMalformed or errTooLarge; a snappy
// block declaring more than the cap is errTooLarge, and the header peek agrees with the
// snappy library on the declared length; an accepted batch re-encodes and decodes to the
// same bytes; after stamping, every stream carries exactly one node_id, the
// authenticated node's, its labels parse back to themselves, and no entry keeps node_id
// in its structured metadata.
func FuzzPushDecode(f *testing.F) {
	const limit = 64 << 10
	ts := time.Unix(1_700_000_000, 0).UTC()
	req := push.PushRequest{Streams: []push.Stream{{
		Labels: `{job="train", node_id="someone-else"}`,
		Entries: []push.Entry{{Timestamp: ts, Line: "step 1 loss 0.5",
			StructuredMetadata: push.LabelsAdapter{{Name: "node_id", Value: "x"}, {Name: "trace", Value: "t1"}}}},
	}}}
	raw, err := req.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(snappy.Encode(nil, raw), false)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}, false) // declares ~4 GiB
	f.Add([]byte{}, false)
	f.Add([]byte(`{"streams":[{"stream":{"job":"a","node_id":"b"},"values":[["1700000000000000000","hello"],["1","x",{"node_id":"n","k":"v"}]]}]}`), true)
	f.Add([]byte(`{"streams":[{"stream":{"a-b":"x"},"values":[]}]}`), true)
	f.Add([]byte(`{"streams":[{"stream":{},"values":[["x","y"]]}]}`), true)
	node := uuid.MustParse("0190f6a0-0000-7000-8000-000000000001")
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		var req push.PushRequest
		var err error
		if asJSON {
			err = decodeJSON(&cappedReader{r: bytes.NewReader(body), limit: limit}, &req)
		} else {
			declared, dlErr := snappy.DecodedLen(body)
			peeked, peekErr := snappyHeaderLen(bufio.NewReaderSize(bytes.NewReader(body), 16))
			if dlErr == nil && peekErr == nil && peeked != declared {
				t.Fatalf("header peek %d, snappy says %d", peeked, declared)
			}
			_, err = decodeSnappyProto(nil, body, limit, &req)
			if dlErr == nil && declared > limit && !errors.Is(err, errTooLarge) {
				t.Fatalf("declared %d bytes over the cap %d: %v", declared, limit, err)
			}
			if err == nil {
				// Re-encoded, the batch decodes to the same bytes.
				m, err := req.Marshal()
				if err != nil {
					t.Fatal(err)
				}
				var again push.PushRequest
				if _, err := decodeSnappyProto(nil, snappy.Encode(nil, m), 1<<30, &again); err != nil {
					t.Fatalf("re-encoded batch refused: %v", err)
				}
				if m2, err := again.Marshal(); err != nil || !bytes.Equal(m, m2) {
					t.Fatalf("round trip changed the batch (%v)", err)
				}
			}
		}
		if err != nil {
			if !errors.Is(err, errMalformed) && !errors.Is(err, errTooLarge) {
				t.Fatalf("refusal %v is neither malformed nor too large", err)
			}
			return
		}
		if err := stamp(&req, node); err != nil {
			if !errors.Is(err, errLabels) {
				t.Fatalf("stamp: %v", err)
			}
			return
		}
		for _, s := range req.Streams {
			labels, err := ParseLabels(s.Labels)
			if err != nil {
				t.Fatalf("stamped labels %q do not parse: %v", s.Labels, err)
			}
			if FormatLabels(labels) != s.Labels {
				t.Fatalf("stamped labels %q format as %q", s.Labels, FormatLabels(labels))
			}
			n := 0
			for _, l := range labels {
				if l.Name == NodeLabel {
					n++
					if l.Value != node.String() {
						t.Fatalf("node_id %q survived stamping: %q", l.Value, s.Labels)
					}
				}
			}
			if n != 1 {
				t.Fatalf("%d node_id labels in %q", n, s.Labels)
			}
			for _, e := range s.Entries {
				if slices.ContainsFunc(e.StructuredMetadata, func(l push.LabelAdapter) bool { return l.Name == NodeLabel }) {
					t.Fatalf("node_id kept in structured metadata: %+v", e.StructuredMetadata)
				}
			}
		}
	})
}
