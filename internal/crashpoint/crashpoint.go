// Package crashpoint kills the process at named points of the protocol, for
// the chaos tests and the soak: a real SIGKILL where a crash hurts most
// (between a PubAck and the queued write, between the provider's accept and
// the status write).
//
// It is compiled in only with the build tag sendonce_crashpoints, which the
// end-to-end tests and "make soak" use. In a default build Hit does nothing
// and nothing reads the environment, so a production binary cannot be made
// to kill itself by a variable. In a tagged build Hit obeys
// SENDONCE_CRASHPOINTS:
//
//	SENDONCE_CRASHPOINTS="relay.after_puback=3"       die at the 3rd hit
//	SENDONCE_CRASHPOINTS="sender.after_accept=0.01"   die at each hit with p=0.01
//
// Several points are separated by commas.
package crashpoint

// The points the code declares.
const (
	// RelayAfterPubAck: a batch is in JetStream, its rows not yet queued.
	RelayAfterPubAck = "relay.after_puback"
	// SenderAfterAccept: the provider accepted, the status is not written.
	SenderAfterAccept = "sender.after_accept"
)

// Env is the variable a tagged build reads.
const Env = "SENDONCE_CRASHPOINTS"

// Tag is the build tag that compiles the crash points in.
const Tag = "sendonce_crashpoints"
