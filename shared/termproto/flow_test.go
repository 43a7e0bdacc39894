package termproto

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestCreditOffGrantsEverythingAndCountsNothing(t *testing.T) {
	var c Credit
	if n, wait, err := c.Take(1 << 30); n != 1<<30 || wait != nil || err != nil {
		t.Fatalf("Take = %d, %v, %v; want everything", n, wait, err)
	}
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d with flow control off", c.InFlight())
	}
	if err := c.Ack(1); err == nil {
		t.Fatal("an acknowledgement with flow control off was accepted")
	}
}

func TestCreditWindow(t *testing.T) {
	var c Credit
	c.Count()
	// Before the window is known, everything is granted and counted.
	if n, _, _ := c.Take(50_000); n != 50_000 {
		t.Fatalf("Take before Limit = %d", n)
	}
	c.Limit(MinWindow)
	// 50,000 in flight exceeds the window: nothing more until acknowledgements.
	n, wait, err := c.Take(1)
	if n != 0 || wait == nil || err != nil {
		t.Fatalf("Take over the window = %d, %v, %v; want 0 and a wait", n, wait, err)
	}
	if err := c.Ack(50_000 - MinWindow + 100); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait:
	default:
		t.Fatal("Ack did not wake the waiter")
	}
	// 100 bytes free: a larger Take gets exactly those.
	if n, _, _ := c.Take(1000); n != 100 {
		t.Fatalf("Take with 100 free = %d", n)
	}
	if c.InFlight() != MinWindow {
		t.Fatalf("in flight %d, want %d", c.InFlight(), MinWindow)
	}
	if err := c.Ack(MinWindow + 1); err == nil {
		t.Fatal("acknowledging more than in flight was accepted")
	}
	if c.InFlight() != MinWindow {
		t.Fatal("a refused acknowledgement changed what is in flight")
	}
	// A window frame's payload: malformed or over what is in flight is refused and
	// changes nothing; a valid one acknowledges its count.
	var frame bytes.Buffer
	if err := WriteWindow(&frame, 1000); err != nil {
		t.Fatal(err)
	}
	_, payload, err := ReadFrame(&frame, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{{0, 0, 1}, {0, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}} {
		if err := c.AckFrame(bad); err == nil || c.InFlight() != MinWindow {
			t.Fatalf("AckFrame(%v) = %v, in flight %d", bad, err, c.InFlight())
		}
	}
	if err := c.AckFrame(payload); err != nil || c.InFlight() != MinWindow-1000 {
		t.Fatalf("AckFrame = %v, in flight %d; want %d", err, c.InFlight(), MinWindow-1000)
	}
}

func TestCreditCloseWakesAndFails(t *testing.T) {
	var c Credit
	c.Limit(MinWindow)
	if n, _, _ := c.Take(MinWindow); n != MinWindow {
		t.Fatal("window not granted")
	}
	_, wait, _ := c.Take(1)
	done := make(chan struct{})
	go func() {
		<-wait
		close(done)
	}()
	c.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
	if _, _, err := c.Take(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Take after Close: %v", err)
	}
	c.Close() // twice is fine
	// A window frame read while the stream is torn down must not wake a closed channel
	// again (that panicked).
	if err := c.Ack(1); err != nil {
		t.Fatalf("Ack after Close: %v", err)
	}
}

func TestDebtAcknowledgesEveryQuarterWindow(t *testing.T) {
	d := NewDebt(64 << 10)
	if n := d.Consumed(16<<10 - 1); n != 0 {
		t.Fatalf("acknowledged %d under a quarter window", n)
	}
	if n := d.Consumed(1); n != 16<<10 {
		t.Fatalf("acknowledged %d at a quarter window, want %d", n, 16<<10)
	}
	if n := d.Consumed(100); n != 0 {
		t.Fatalf("acknowledged %d right after an acknowledgement", n)
	}
	if n := d.Consumed(40 << 10); n != 100+40<<10 {
		t.Fatalf("acknowledged %d, want everything owed", n)
	}
}

func TestWindowFrames(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteWindow(&buf, 70000); err != nil {
		t.Fatal(err)
	}
	typ, p, err := ReadFrame(&buf, nil)
	if err != nil || typ != FrameWindow {
		t.Fatalf("ReadFrame = %d, %v", typ, err)
	}
	if n, err := ParseWindow(p); n != 70000 || err != nil {
		t.Fatalf("ParseWindow = %d, %v", n, err)
	}
	for _, bad := range [][]byte{{}, {0, 0, 1}, {0, 0, 0, 1, 0}, {0, 0, 0, 0}} {
		if _, err := ParseWindow(bad); err == nil {
			t.Errorf("ParseWindow(%v) accepted", bad)
		}
	}
	for w, ok := range map[int]bool{MinWindow - 1: false, MinWindow: true, MaxWindow: true, MaxWindow + 1: false, -1: false} {
		if ValidWindow(w) != ok {
			t.Errorf("ValidWindow(%d) = %v", w, !ok)
		}
	}
}

func TestCreditWriteData(t *testing.T) {
	var c Credit
	c.Limit(MinWindow)
	var mu sync.Mutex
	var buf bytes.Buffer
	p := bytes.Repeat([]byte("o"), MinWindow+10)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- c.WriteData(&mu, &buf, p, stop) }()
	// The window's worth goes out as frames; the last 10 bytes wait for credit.
	deadline := time.Now().Add(5 * time.Second)
	for c.InFlight() < MinWindow && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := c.Ack(10); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := 0
	for buf.Len() > 0 {
		typ, pl, err := ReadFrame(&buf, nil)
		if err != nil || typ != FrameData {
			t.Fatalf("frame %d, %v", typ, err)
		}
		got += len(pl)
	}
	mu.Unlock()
	if got != len(p) {
		t.Fatalf("%d bytes framed, want %d", got, len(p))
	}
	// A full window and a closed stop: ErrClosed, not a hang.
	close(stop)
	if err := c.WriteData(&mu, &buf, []byte("x"), stop); !errors.Is(err, ErrClosed) {
		t.Fatalf("WriteData with the window full and stop closed: %v", err)
	}
}
