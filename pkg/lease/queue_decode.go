package lease

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The waiters at the front of the queue judge every change of the Lease
// they wait on (and, before only the front watched every change, every
// waiter did), so reading the queue is on the path of every hand-off: with
// a few hundred waiters, encoding/json's reflection-driven decoder (about
// 0.3 ms for 200 entries) made the hand-off wait for the whole herd's CPU.
// The queue is written only by json.Marshal of []Waiter, whose output has
// one exact shape; decodeQueue reads that shape directly and hands anything
// else (whitespace, escapes, other key orders, malformed text) to
// encoding/json, so the result is always what json.Unmarshal would give.

// decodeQueue decodes the queue annotation raw. ok is false when raw is not
// valid JSON for []Waiter.
func decodeQueue(raw string) (q []Waiter, ok bool) {
	if q, ok := decodeCanonicalQueue(raw); ok {
		return q, true
	}
	if err := json.Unmarshal([]byte(raw), &q); err != nil {
		return nil, false
	}
	return q, true
}

// decodeCanonicalQueue reads raw in the exact form json.Marshal writes a
// []Waiter in: [{"id":"…","t":"…"[,"p":N]},…], with no escapes anywhere. ok is false for anything else, which the caller then hands to
// encoding/json.
func decodeCanonicalQueue(raw string) ([]Waiter, bool) {
	d := canonicalDecoder{rest: raw}
	if !plainStrings(raw) || !d.take("[") {
		return nil, false
	}
	q := make([]Waiter, 0, min(strings.Count(raw, "{"), MaxQueue))
	if d.take("]") {
		return q, d.rest == ""
	}
	for {
		w, ok := d.waiter()
		if !ok {
			return nil, false
		}
		q = append(q, w)
		if d.take("]") {
			return q, d.rest == ""
		}
		if !d.take(",") {
			return nil, false
		}
	}
}

// canonicalDecoder consumes a string from the front.
type canonicalDecoder struct {
	rest string
}

// take consumes prefix if rest starts with it.
func (d *canonicalDecoder) take(prefix string) bool {
	if !strings.HasPrefix(d.rest, prefix) {
		return false
	}
	d.rest = d.rest[len(prefix):]
	return true
}

// waiter reads {"id":"…","t":"…"[,"p":N]}.
func (d *canonicalDecoder) waiter() (w Waiter, ok bool) {
	if !d.take(`{"id":`) {
		return Waiter{}, false
	}
	if w.Identity, ok = d.str(); !ok || !d.take(`,"t":`) {
		return Waiter{}, false
	}
	if w.Ticket, ok = d.str(); !ok {
		return Waiter{}, false
	}
	if d.take(`,"p":`) {
		if w.Priority, ok = d.int32(); !ok || w.Priority == 0 {
			return Waiter{}, false // omitempty never writes a zero
		}
	}
	return w, d.take("}")
}

// str reads a JSON string; plainStrings has checked that raw holds no
// escapes, control characters or invalid UTF-8.
func (d *canonicalDecoder) str() (string, bool) {
	if !d.take(`"`) {
		return "", false
	}
	end := strings.IndexByte(d.rest, '"')
	if end < 0 {
		return "", false
	}
	s := d.rest[:end]
	d.rest = d.rest[end+1:]
	return s, true
}

// plainStrings reports whether raw has no backslash (so no escapes), no
// control characters (which JSON strings may not hold) and is valid UTF-8
// (encoding/json would replace invalid bytes): then every JSON string in it
// means exactly its bytes.
func plainStrings(raw string) bool {
	ascii := true
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '\\' || c < 0x20:
			return false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return ascii || utf8.ValidString(raw)
}

// int32 reads an integer in the form json.Marshal writes one.
func (d *canonicalDecoder) int32() (int32, bool) {
	end := 0
	if strings.HasPrefix(d.rest, "-") {
		end = 1
	}
	digits := end
	for end < len(d.rest) && d.rest[end] >= '0' && d.rest[end] <= '9' {
		end++
	}
	if end == digits || (d.rest[digits] == '0' && end > digits+1) {
		return 0, false // no digits, or a leading zero
	}
	n, err := strconv.ParseInt(d.rest[:end], 10, 32)
	if err != nil {
		return 0, false
	}
	d.rest = d.rest[end:]
	return int32(n), true
}
