package lease

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// jsonQueue is what encoding/json makes of raw: the meaning decodeQueue
// must keep.
func jsonQueue(raw string) ([]Waiter, bool) {
	var q []Waiter
	if err := json.Unmarshal([]byte(raw), &q); err != nil {
		return nil, false
	}
	return q, true
}

func TestDecodeQueueAgreesWithEncodingJSON(t *testing.T) {
	cases := map[string]string{
		"empty array":              `[]`,
		"null":                     `null`,
		"one waiter":               `[{"id":"a","t":"t1"}]`,
		"priorities":               `[{"id":"a","t":"t1","p":7},{"id":"b","t":"t2","p":-3},{"id":"c","t":"t3"}]`,
		"largest priority":         `[{"id":"a","t":"t1","p":2147483647},{"id":"b","t":"t2","p":-2147483648}]`,
		"priority out of range":    `[{"id":"a","t":"t1","p":2147483648}]`,
		"priority as a float":      `[{"id":"a","t":"t1","p":1.5}]`,
		"priority with exponent":   `[{"id":"a","t":"t1","p":1e2}]`,
		"priority leading zero":    `[{"id":"a","t":"t1","p":07}]`,
		"priority zero written":    `[{"id":"a","t":"t1","p":0}]`,
		"priority minus zero":      `[{"id":"a","t":"t1","p":-0}]`,
		"escaped quote":            `[{"id":"a\"b","t":"t1"}]`,
		"escaped unicode":          `[{"id":"\u003cpod\u003e","t":"t1"}]`,
		"unicode":                  `[{"id":"pöd-ü","t":"t1"}]`,
		"invalid utf-8":            "[{\"id\":\"a\xffb\",\"t\":\"t1\"}]",
		"control character":        "[{\"id\":\"a\tb\",\"t\":\"t1\"}]",
		"whitespace":               `[ {"id": "a", "t": "t1"} ]`,
		"other key order":          `[{"t":"t1","id":"a"}]`,
		"unknown field":            `[{"id":"a","t":"t1","x":1}]`,
		"missing ticket":           `[{"id":"a"}]`,
		"empty ticket":             `[{"id":"a","t":""}]`,
		"trailing comma":           `[{"id":"a","t":"t1"},]`,
		"trailing garbage":         `[{"id":"a","t":"t1"}]x`,
		"unterminated":             `[{"id":"a","t":"t1"`,
		"unterminated string":      `[{"id":"a`,
		"not an array":             `{"id":"a","t":"t1"}`,
		"garbage":                  `not json`,
		"empty string":             ``,
		"ticket that looks like t": `[{"id":"\"t\":\"x\"","t":"t1"}]`,
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			got, gotOK := decodeQueue(raw)
			want, wantOK := jsonQueue(raw)
			if gotOK != wantOK || !reflect.DeepEqual(got, want) && (len(got) != 0 || len(want) != 0) {
				t.Errorf("decodeQueue(%q) = %v, %v; encoding/json: %v, %v", raw, got, gotOK, want, wantOK)
			}
		})
	}
}

// Whatever json.Marshal writes is read back by the fast path itself, with
// the same meaning; identities that need escapes go the slow way, with the
// same result.
func TestDecodeQueueReadsWhatMarshalWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcz09-./:_ \"\\<>&ü\u2028\t")
	for i := range 500 {
		q := make([]Waiter, rng.IntN(20))
		plain := true
		for j := range q {
			id := make([]rune, 1+rng.IntN(12))
			for k := range id {
				id[k] = alphabet[rng.IntN(len(alphabet))]
			}
			q[j] = Waiter{Identity: string(id), Ticket: fmt.Sprintf("%016x", rng.Uint64()), Priority: int32(rng.IntN(5)) - 2}
			if b, _ := json.Marshal(q[j].Identity); string(b) != `"`+q[j].Identity+`"` {
				plain = false
			}
		}
		raw, err := json.Marshal(q)
		if err != nil {
			t.Fatal(err)
		}
		fast, fastOK := decodeCanonicalQueue(string(raw))
		if plain && (!fastOK || !reflect.DeepEqual(fast, q) && len(q) > 0) {
			t.Fatalf("case %d: the fast path did not read %s back: %v %v", i, raw, fast, fastOK)
		}
		got, ok := decodeQueue(string(raw))
		if !ok || !reflect.DeepEqual(got, q) && len(q) > 0 {
			t.Fatalf("case %d: decodeQueue(%s) = %v, %v; want %v", i, raw, got, ok, q)
		}
	}
}

// FuzzDecodeQueue: for any text, the result is encoding/json's.
func FuzzDecodeQueue(f *testing.F) {
	for _, seed := range []string{`[]`, `[{"id":"a","t":"t1","p":3}]`, `[{"id":"a\"","t":"t1"}]`, `[{"id":"a","t":"t1","p":-0}]`, "[{\"id\":\"\xff\",\"t\":\"x\"}]"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, gotOK := decodeQueue(raw)
		want, wantOK := jsonQueue(raw)
		if gotOK != wantOK || !reflect.DeepEqual(got, want) && (len(got) != 0 || len(want) != 0) {
			t.Errorf("decodeQueue(%q) = %v, %v; encoding/json: %v, %v", raw, got, gotOK, want, wantOK)
		}
	})
}

// BenchmarkQueue200 reads a queue of 200 waiters, as every waiter does at
// every change of the Lease.
func BenchmarkQueue200(b *testing.B) {
	l := heldLease("a", 1)
	for i := range 200 {
		var err error
		if l, err = Enqueue(l, Waiter{Identity: fmt.Sprintf("default/worker-%d-7d9c5b6f4-x2x9z/5f0c2a1e-uid", i), Ticket: fmt.Sprintf("%016x", i*7919)}); err != nil {
			b.Fatal(err)
		}
	}
	raw := l.Annotations[QueueAnnotation]
	b.Run("fast path", func(b *testing.B) {
		for range b.N {
			if len(Queue(l)) != 200 {
				b.Fatal("lost waiters")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for range b.N {
			if q, _ := jsonQueue(raw); len(q) != 200 {
				b.Fatal("lost waiters")
			}
		}
	})
}
