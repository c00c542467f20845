// Package safetext makes text that came from outside sendonce fit for a log,
// a row and an operator's screen: a provider's error message, a dead letter
// that any holder of the sms.dlq publish permission could have written, an
// error stored by an older release.
//
// Two things are removed. Characters that change how a terminal or a page
// shows the text rather than being part of it: C0 and C1 controls (ESC and
// U+009B start terminal escape sequences, a CR or a newline forges a line),
// format characters (the bidi embeddings, overrides and isolates U+202A-202E
// and U+2066-2069, the marks U+200E, U+200F and U+061C, zero-width
// characters) and the line and paragraph separators; each becomes a space.
// And phone numbers and one-time codes however they are written: see
// MaskNumbers.
//
// Apart from that, MessageText gives the form in which two copies of one SMS
// text compare equal: a lookup at a provider that keeps no reference of ours
// (Twilio) finds a message by the body the provider stored, which may differ
// from ours in line breaks, Unicode normalisation or white space at the ends.
package safetext

import (
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Mask replaces a masked run of digits.
const Mask = "#"

// Clean returns s as valid UTF-8 (an invalid byte becomes U+FFFD) with every
// control, format and line or paragraph separator character replaced by a
// space.
func Clean(s string) string {
	if plainASCII(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.Map(func(r rune) rune {
		if hidden(r) {
			return ' '
		}
		return r
	}, s)
}

// hidden reports whether r controls how text is shown rather than being
// part of it.
func hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// plainASCII reports whether s holds only printable ASCII.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Normalize returns s cleaned and folded so that a number reads as one
// whatever its encoding: %XX escapes of ASCII characters that are neither
// letters nor digits (%20, %2D, %2B) decoded to a space, then NFKC (full-width
// digits become ASCII, NBSP, thin and other spaces a space, U+2011 a hyphen),
// then Clean.
func Normalize(s string) string {
	if plainASCII(s) && !strings.Contains(s, "%") {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = unescapeSeparators(s)
	return Clean(norm.NFKC.String(s))
}

// unescapeSeparators decodes %XX escapes of ASCII characters that are not
// letters or digits to a space, so that an encoded number is seen as one.
func unescapeSeparators(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil && v < 0x80 && Separator(rune(v)) {
				b.WriteByte(' ')
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Separator reports whether r may stand between the digits of one number:
// any character that is neither a letter nor a digit.
func Separator(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }

// MaskNumbers replaces with Mask every run of four or more digits of any
// script in s, where up to three separators in a row (characters that are
// neither letters nor digits: "+1 - 555 - 123 - 4567", "555/123_4567",
// "555,123,4567") continue a run; and every run of three digits that own
// contains (the digits of the message's own number, ASCII; "" for none).
// Run it on Normalize's output.
func MaskNumbers(s, own string) string {
	if !strings.ContainsFunc(s, unicode.IsDigit) {
		return s
	}
	rs := []rune(s)
	var b strings.Builder
	var digits []byte
	for i := 0; i < len(rs); {
		if !unicode.IsDigit(rs[i]) {
			b.WriteRune(rs[i])
			i++
			continue
		}
		j := i
		digits = digits[:0]
		for {
			for j < len(rs) && unicode.IsDigit(rs[j]) {
				digits = append(digits, '0'+digitValue(rs[j]))
				j++
			}
			k := j
			for k < len(rs) && k-j < 3 && Separator(rs[k]) {
				k++
			}
			if k == j || k == len(rs) || !unicode.IsDigit(rs[k]) {
				break
			}
			j = k
		}
		if len(digits) >= 4 || (len(digits) == 3 && strings.Contains(own, string(digits))) {
			b.WriteString(Mask)
		} else {
			b.WriteString(string(rs[i:j]))
		}
		i = j
	}
	return b.String()
}

// digitValue returns the value of the decimal digit r of any script: Unicode
// allocates each script's digits as one contiguous run of ten, zero first,
// so r's value is its distance from the start of its run of digits, modulo
// ten (some runs are several scripts' digits back to back).
func digitValue(r rune) byte {
	if r >= '0' && r <= '9' {
		return byte(r - '0')
	}
	start := r
	for unicode.IsDigit(start - 1) {
		start--
	}
	return byte((r - start) % 10)
}

// Field returns text for an operator's screen: normalised, cleaned and with
// number-like runs masked. Use it on free text that did not come from
// sendonce's own code: errors, details, a dead letter's fields.
func Field(s string) string { return MaskNumbers(Normalize(s), "") }

// Digits returns the ASCII digits of s, for MaskNumbers' own.
func Digits(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// MaskPhone keeps an E.164 number's leading "+" and first digit (the start
// of the country code) and its last two digits: "+15551234567" becomes
// "+1*******67". What a log line or a page may show of a number.
func MaskPhone(e164 string) string {
	if len(e164) < 5 {
		return "+***"
	}
	b := []byte(e164)
	for i := 2; i < len(b)-2; i++ {
		b[i] = '*'
	}
	return string(b)
}
