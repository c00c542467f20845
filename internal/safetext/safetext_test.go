package safetext

import (
	"strings"
	"testing"
)

func TestClean(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"plain text 123", "plain text 123"},
		{"csi \u009b31m red", "csi  31m red"},
		{"esc \x1b[2J clear", "esc  [2J clear"},
		{"override \u202eevil\u202c", "override  evil "},
		{"isolates \u2066a\u2067b\u2068c\u2069", "isolates  a b c "},
		{"marks \u200e\u200f\u061c", "marks    "},
		{"zero width \u200b\u200d\ufeff", "zero width    "},
		{"lines\r\n\u2028\u2029", "lines    "},
		{"tab\there", "tab here"},
		{"bad \xff byte", "bad \ufffd byte"},
		{"é ü 漢字", "é ü 漢字"},
	}
	for _, tt := range tests {
		if got := Clean(tt.in); got != tt.want {
			t.Errorf("Clean(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestMaskNumbers(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, own, want string }{
		{"call 123", "", "call 123"},
		{"code 4829", "", "code #"},
		{"+1 - 555 - 123 - 4567", "", "+#"},
		{"555/123_4567,89", "", "#"},
		{"+1\u00a0555\u00a0123\u00a04567", "", "+#"},
		{"+1\u2009555\u2009123\u20094567", "", "+#"},
		{"555\u2011123\u20114567", "", "#"},
		{"\uff0b\uff11\uff15\uff15\uff15\uff11\uff12\uff13\uff14", "", "+#"},
		{"\u0665\u0665\u0665\u0661\u0662\u0663\u0664", "", "#"},
		{"555%20123%204567", "", "#"},
		{"%2B1%2D555%2D1234", "", " #"},
		{"1 2 3", "", "1 2 3"},
		{"1    2 3 4", "", "1    2 3 4"},
		{"ends 567", "15551234567", "ends #"},
		{"ends \u0665\u0666\u0667", "15551234567", "ends #"},
		{"http 400", "15551234567", "http 400"},
	}
	for _, tt := range tests {
		if got := MaskNumbers(Normalize(tt.in), tt.own); got != tt.want {
			t.Errorf("MaskNumbers(Normalize(%q), %q) = %q, want %q", tt.in, tt.own, got, tt.want)
		}
	}
}

func TestField(t *testing.T) {
	t.Parallel()
	got := Field("http 400: \u202eTo +1 (555) 123-4567\u202c refused \u009b")
	if strings.ContainsAny(got, "\u202e\u202c\u009b") || strings.Contains(got, "4567") {
		t.Fatalf("Field = %q", got)
	}
	if got := Field("http 503: unavailable"); got != "http 503: unavailable" {
		t.Fatalf("Field changed plain text: %q", got)
	}
}

func TestDigitValue(t *testing.T) {
	t.Parallel()
	for _, zero := range []rune{'0', '\u0660', '\u06f0', '\u0966', '\uff10', '\U0001d7ce', '\U0001d7d8'} {
		for v := range rune(10) {
			if got := digitValue(zero + v); rune(got) != v {
				t.Errorf("digitValue(%U) = %d, want %d", zero+v, got, v)
			}
		}
	}
}
