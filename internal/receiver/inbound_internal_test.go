package receiver

import (
	"strings"
	"testing"
)

// A reply counts only when it is, as a whole (trimmed, in any case), one
// of the CTIA's keywords: the opt-outs STOP, STOPALL, UNSUBSCRIBE, CANCEL,
// END, QUIT and the opt-ins START, UNSTOP, YES. HELP, a keyword in a
// sentence, a look-alike in other letters are none.
func TestKeywords(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]string{
		"STOP": "STOP", " stop\n": "STOP", "Stop": "STOP", "STOPALL": "STOPALL", "unsubscribe": "UNSUBSCRIBE", "Cancel": "CANCEL",
		"END": "END", "quit ": "QUIT", "\tSTART\r\n": "+START", "unstop": "+UNSTOP", "Yes": "+YES",
		"HELP": "", "INFO": "", "stop please": "", "STOP!": "", "stop all": "", "please stop": "", "": "", "S T O P": "",
		"ＳＴＯＰ": "", "ſtop": "", "stop\x00": "", "yes, I want them": "", strings.Repeat("stop", 10): "", "STOP.": "",
	} {
		kw, lift, ok := Keyword(text)
		got := kw
		if lift {
			got = "+" + kw
		}
		if !ok {
			got = ""
		}
		if got != want {
			t.Errorf("%q: %q, want %q", text, got, want)
		}
	}
}

// A sender's number as providers write it: E.164, or Vonage's digits.
func TestInboundNumber(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"+15551234567": "+15551234567", "15551234567": "+15551234567", " +447700900001 ": "+447700900001",
		"Acme": "", "12345678901234567": "", "+0123": "", "": "", "+": "", "55512": "+55512", "+1 555 123 4567": "",
	} {
		if got := inboundNumber(in); got != want {
			t.Errorf("inboundNumber(%q) = %q, want %q", in, got, want)
		}
	}
}
