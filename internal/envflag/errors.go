package envflag

import "errors"

// ErrRefused is matched (errors.Is) by every error Parse returns for a bad
// setting: a value that does not parse, one out of its range, a required
// one missing, a secret on the command line, a cross-setting check that
// failed. A program stops start-up on it (Command exits 2); -h is not one
// (flag.ErrHelp).
var ErrRefused = errors.New("configuration refused")

// SettingError is one refused setting. Setting names what the operator
// sets: the environment variable (or "-flag / VAR"), or "" for a
// cross-setting check, which names its settings in its text. The text
// never holds a secret's value.
type SettingError struct {
	Setting string
	Err     error
}

func (e *SettingError) Error() string { return e.Err.Error() }

// Unwrap returns the reason.
func (e *SettingError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrRefused) true.
func (e *SettingError) Is(target error) bool { return target == ErrRefused }

// refused wraps err as setting's refusal, unless it already is one.
func refused(setting string, err error) error {
	var se *SettingError
	if err == nil || errors.As(err, &se) {
		return err
	}
	return &SettingError{Setting: setting, Err: err}
}
