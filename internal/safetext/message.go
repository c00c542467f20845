package safetext

import (
	"strings"

	"golang.org/x/text/unicode/norm"
)

// MessageText returns the form of an SMS text that two copies of one
// message share, whatever a provider did to it between the request and its
// own record (Twilio, asked for its messages, answers the body it stored):
//
//   - line breaks are LF: CRLF and a lone CR become LF (form encoding and
//     some carriers turn one into the other);
//   - Unicode NFC: a precomposed letter and its decomposed spelling ("é" as
//     U+00E9 or as e and U+0301) are one text; compatibility forms (NFKC:
//     full-width digits, ligatures) stay apart, since a provider does not
//     fold them and a text that differs only there is another text;
//   - no white space (Unicode White_Space) at either end;
//   - invalid UTF-8 bytes become U+FFFD.
//
// Nothing else is folded: case, inner spacing and punctuation are the text.
func MessageText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, '\r') >= 0 {
		s = strings.ReplaceAll(s, "\r\n", "\n")
		s = strings.ReplaceAll(s, "\r", "\n")
	}
	if !plainASCII(s) {
		s = norm.NFC.String(s)
	}
	return strings.TrimSpace(s)
}

// SameText reports whether a and b are the same SMS text: their
// MessageText forms are equal.
func SameText(a, b string) bool {
	if a == b {
		return true
	}
	return MessageText(a) == MessageText(b)
}
