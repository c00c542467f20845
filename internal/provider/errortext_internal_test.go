package provider

import "testing"

// Every adapter reads its error answer's code and text through errorCode
// and errorText: a code the attempts log can hold or 0, and "head: tail"
// without a dangling separator.
func TestErrorCodeAndText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{
		"21211": 21211, `"10001"`: 10001, " 42 ": 42, "0": 0, "-3": 0, "2147483648": 0,
		"syntax_invalid_parameter_format": 0, "": 0, "1.5": 0,
	} {
		if got := errorCode(in); got != want {
			t.Errorf("errorCode(%q) = %d, want %d", in, got, want)
		}
	}
	for _, c := range []struct{ head, tail, want string }{
		{"Invalid parameters", "The to number is invalid", "Invalid parameters: The to number is invalid"},
		{"Invalid parameters", "", "Invalid parameters"},
		{"", "The to number is invalid", "The to number is invalid"},
		{" spaced ", " out ", "spaced: out"},
		{"", "", ""},
	} {
		if got := errorText(c.head, c.tail); got != c.want {
			t.Errorf("errorText(%q, %q) = %q, want %q", c.head, c.tail, got, c.want)
		}
	}
}
