package terminal

// ReplayBytes is how much recent output a session keeps for a reattaching client.
const ReplayBytes = 64 << 10

// ring keeps the most recent ReplayBytes of a session's output. It is the only output
// buffer a session has, and it never grows past its capacity.
type ring struct {
	buf   []byte // allocated on first write, len == cap == size
	size  int
	start int // index of the oldest byte
	n     int // bytes held
}

func newRing(size int) *ring { return &ring{size: size} }

// Write appends p, overwriting the oldest bytes once full.
func (r *ring) Write(p []byte) {
	if len(p) == 0 {
		return
	}
	if r.buf == nil {
		r.buf = make([]byte, r.size)
	}
	if len(p) >= r.size {
		copy(r.buf, p[len(p)-r.size:])
		r.start, r.n = 0, r.size
		return
	}
	end := (r.start + r.n) % r.size
	c := copy(r.buf[end:], p)
	copy(r.buf, p[c:])
	r.n += len(p)
	if r.n > r.size {
		r.start = (r.start + r.n - r.size) % r.size
		r.n = r.size
	}
}

// Bytes returns a copy of the held bytes, oldest first.
func (r *ring) Bytes() []byte {
	out := make([]byte, r.n)
	c := copy(out, r.buf[r.start:min(r.start+r.n, len(r.buf))])
	copy(out[c:], r.buf[:r.n-c])
	return out
}

// Len is the number of bytes held (never more than the ring's size).
func (r *ring) Len() int { return r.n }
