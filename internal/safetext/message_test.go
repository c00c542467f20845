package safetext

import "testing"

func TestSameText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{"equal", "Your code is 482901", "Your code is 482901", true},
		{"CRLF and LF", "Line one\r\nLine two", "Line one\nLine two", true},
		{"lone CR and LF", "Line one\rLine two", "Line one\nLine two", true},
		{"NFD and NFC", "Caf\u0065\u0301 ouvert", "Caf\u00e9 ouvert", true},
		{"Hangul jamo and syllable", "\u1100\u1161", "\uac00", true},
		{"trailing newline", "See you\n", "See you", true},
		{"leading and trailing spaces", "  See you \t", "See you", true},
		{"no-break space at the end", "See you\u00a0", "See you", true},
		{"all at once", " Caf\u0065\u0301\r\nopen\r\n", "Caf\u00e9\nopen", true},
		{"another text", "Your code is 482901", "Your code is 482902", false},
		{"case", "See you", "see you", false},
		{"inner spacing", "See  you", "See you", false},
		{"inner blank line", "a\n\nb", "a\nb", false},
		{"full-width digits stay apart (NFKC)", "code \uff14\uff18\uff12", "code 482", false},
		{"ligature stays apart (NFKC)", "\ufb01le", "file", false},
		{"empty and blank", "", " \r\n", true},
	}
	for _, tt := range tests {
		if got := SameText(tt.a, tt.b); got != tt.same {
			t.Errorf("%s: SameText(%q, %q) = %v, want %v", tt.name, tt.a, tt.b, got, tt.same)
		}
		if got := SameText(tt.b, tt.a); got != tt.same {
			t.Errorf("%s: SameText(%q, %q) = %v, want %v (not symmetric)", tt.name, tt.b, tt.a, got, tt.same)
		}
	}
	if got := MessageText("bad \xff byte\r\n"); got != "bad \ufffd byte" {
		t.Errorf("MessageText of invalid UTF-8 = %q", got)
	}
}
