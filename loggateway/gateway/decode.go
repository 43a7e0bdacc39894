package gateway

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"
)

// errTooLarge and errMalformed are the two ways a body is refused by the decoder.
var (
	errTooLarge  = errors.New("batch over the size cap")
	errMalformed = errors.New("malformed batch")
)

type bodyFormat int

const (
	formatProto bodyFormat = iota // protobuf in a snappy block (Loki's default)
	formatJSON                    // Loki's JSON form
)

// requestFormat tells the body's format and whether it is gzip-encoded, as Loki's own
// distributor does: application/json is the JSON form, anything else is protobuf.
func requestFormat(r *http.Request) (bodyFormat, bool, error) {
	gz := false
	switch r.Header.Get("Content-Encoding") {
	case "", "identity":
	case "gzip":
		gz = true
	default:
		return 0, false, fmt.Errorf("%w: unsupported Content-Encoding", errMalformed)
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return formatProto, gz, nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return 0, false, fmt.Errorf("%w: bad Content-Type", errMalformed)
	}
	if mt == "application/json" {
		return formatJSON, gz, nil
	}
	return formatProto, gz, nil
}

// snappyHeaderLen reads the uvarint decoded-length header of a snappy block from br
// without consuming it, so the cap is checked before anything is allocated by it.
func snappyHeaderLen(br *bufio.Reader) (int, error) {
	var n uint64
	for i := 0; i < 10; i++ {
		b, err := br.Peek(i + 1)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, fmt.Errorf("%w: truncated snappy block", errMalformed)
			}
			return 0, err
		}
		c := b[i]
		n |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			if n > 1<<31 {
				return 0, errTooLarge
			}
			return int(n), nil
		}
	}
	return 0, fmt.Errorf("%w: bad snappy header", errMalformed)
}

// readCapped reads all of r into buf (grown as needed), refusing more than limit bytes.
func readCapped(r io.Reader, buf []byte, limit int) ([]byte, error) {
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			if len(buf) > limit {
				return buf, errTooLarge
			}
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			return buf, errTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// decodeSnappyProto decodes a snappy block whose decoded length was checked, into dst.
// The returned request's strings point into the returned buffer.
func decodeSnappyProto(dst, compressed []byte, limit int, req *push.PushRequest) ([]byte, error) {
	n, err := snappy.DecodedLen(compressed)
	if err != nil {
		return dst, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if n > limit {
		return dst, errTooLarge
	}
	if cap(dst) < n {
		dst = make([]byte, n)
	}
	out, err := snappy.Decode(dst[:cap(dst)], compressed)
	if err != nil {
		return dst, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := req.Unmarshal(out); err != nil {
		return out, fmt.Errorf("%w: %v", errMalformed, err)
	}
	return out, nil
}

// jsonPush is Loki's JSON push form:
// {"streams":[{"stream":{"k":"v"},"values":[["<unix ns>","line"],["<unix ns>","line",{"meta":"v"}]]}]}.
type jsonPush struct {
	Streams []jsonStream `json:"streams"`
}

type jsonStream struct {
	Stream map[string]string   `json:"stream"`
	Values [][]json.RawMessage `json:"values"`
}

// decodeJSON reads Loki's JSON form from r (already capped) into req.
func decodeJSON(r io.Reader, req *push.PushRequest) error {
	var in jsonPush
	if err := json.NewDecoder(r).Decode(&in); err != nil {
		if errors.Is(err, errTooLarge) {
			return err
		}
		return fmt.Errorf("%w: %v", errMalformed, err)
	}
	req.Streams = make([]push.Stream, 0, len(in.Streams))
	for _, s := range in.Streams {
		if len(s.Stream) > maxLabels {
			return errMalformed
		}
		labels := make([]Label, 0, len(s.Stream))
		for k, v := range s.Stream {
			if nameLen(k) != len(k) || k == "" {
				return fmt.Errorf("%w: bad label name", errMalformed)
			}
			labels = append(labels, Label{Name: k, Value: v})
		}
		st := push.Stream{Labels: FormatLabels(labels), Entries: make([]push.Entry, 0, len(s.Values))}
		for _, v := range s.Values {
			if len(v) < 2 || len(v) > 3 {
				return fmt.Errorf("%w: a value is [ts, line] or [ts, line, metadata]", errMalformed)
			}
			var tsStr, line string
			if json.Unmarshal(v[0], &tsStr) != nil || json.Unmarshal(v[1], &line) != nil {
				return fmt.Errorf("%w: bad value", errMalformed)
			}
			ns, err := strconv.ParseInt(tsStr, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: bad timestamp", errMalformed)
			}
			e := push.Entry{Timestamp: time.Unix(0, ns).UTC(), Line: line}
			if len(v) == 3 {
				var meta push.LabelsAdapter
				if err := json.Unmarshal(v[2], &meta); err != nil {
					return fmt.Errorf("%w: bad structured metadata", errMalformed)
				}
				e.StructuredMetadata = meta
			}
			st.Entries = append(st.Entries, e)
		}
		req.Streams = append(req.Streams, st)
	}
	return nil
}

// cappedReader fails with errTooLarge once more than limit bytes have been read, so a
// gzip or JSON bomb stops at the cap however well it compresses.
type cappedReader struct {
	r     io.Reader
	limit int
	n     int
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.n > c.limit {
		return 0, errTooLarge
	}
	if room := c.limit + 1 - c.n; len(p) > room {
		p = p[:room]
	}
	n, err := c.r.Read(p)
	c.n += n
	if c.n > c.limit {
		return n, errTooLarge
	}
	return n, err
}

// gunzipCapped decompresses r, failing past limit decompressed bytes.
func gunzipCapped(r io.Reader, limit int) (io.Reader, func(), error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w: bad gzip", errMalformed)
	}
	return &cappedReader{r: zr, limit: limit}, func() { _ = zr.Close() }, nil
}
