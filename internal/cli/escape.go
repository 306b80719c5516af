package cli

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// printable is s as the plugin prints it: printable ASCII (space to '~')
// as it is, anything else escaped as a Go string literal escapes it
// (\n, \t, \x1b, \x7f, \u202e, and \xff for a byte that is not UTF-8). So
// a string read from the cluster (a holder identity, a principal, a
// condition or event message, an error from the apiserver) cannot end a
// line, move the cursor or reorder the text around it: nothing it holds
// can forge a line of output. Every string the plugin did not write itself
// goes through it before it reaches a terminal.
func printable(s string) string {
	if isPrintableASCII(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case r >= ' ' && r <= '~':
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r) // e.g. '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// isPrintableASCII reports whether every byte of s is printable ASCII.
func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
