package console

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

// Role is what a user may do: look (viewer) or also replay (operator).
type Role string

// The roles of the users file.
const (
	RoleViewer   Role = "viewer"
	RoleOperator Role = "operator"
)

// MinCost is the least bcrypt cost a users file may hold: bcrypt's
// default. A cheaper hash gives a stolen users file away.
const MinCost = bcrypt.DefaultCost

// User is one line of the users file.
type User struct {
	Name string
	// Hash is the password's bcrypt hash.
	Hash []byte
	Role Role
}

var userName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// ParseUsers reads a users file: one user a line, "name:bcrypt-hash:role",
// role viewer or operator; blank lines and lines starting with # are
// ignored. An error names the line; it never quotes a hash.
func ParseUsers(r io.Reader) ([]User, error) {
	var users []User
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) != 3 {
			return nil, fmt.Errorf("line %d: want name:bcrypt-hash:role", n)
		}
		u := User{Name: parts[0], Hash: []byte(parts[1]), Role: Role(parts[2])}
		if !userName.MatchString(u.Name) {
			return nil, fmt.Errorf("line %d: a user name is 1 to 64 of A-Z a-z 0-9 . _ @ -", n)
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("line %d: user %s appears twice", n, u.Name)
		}
		seen[u.Name] = true
		cost, err := bcrypt.Cost(u.Hash)
		if err != nil {
			return nil, fmt.Errorf("line %d (user %s): not a bcrypt hash", n, u.Name)
		}
		if cost < MinCost {
			return nil, fmt.Errorf("line %d (user %s): bcrypt cost %d is below %d", n, u.Name, cost, MinCost)
		}
		if u.Role != RoleViewer && u.Role != RoleOperator {
			return nil, fmt.Errorf("line %d (user %s): role %q, want viewer or operator", n, u.Name, u.Role)
		}
		users = append(users, u)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, errors.New("no users")
	}
	return users, nil
}

// LoadUsers reads the users file at path.
func LoadUsers(path string) ([]User, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseUsers(f)
}

// UserLine returns the users-file line of a new user: the password hashed
// with bcrypt at MinCost.
func UserLine(name string, role Role, password string) (string, error) {
	if !userName.MatchString(name) {
		return "", errors.New("a user name is 1 to 64 of A-Z a-z 0-9 . _ @ -")
	}
	if role != RoleViewer && role != RoleOperator {
		return "", fmt.Errorf("role %q, want viewer or operator", role)
	}
	if len(password) < 12 {
		return "", errors.New("a password has at least 12 characters")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), MinCost)
	if err != nil {
		return "", err
	}
	return name + ":" + string(h) + ":" + string(role), nil
}
