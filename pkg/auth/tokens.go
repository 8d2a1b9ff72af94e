package auth

import (
	"bufio"
	"crypto/subtle"
	"fmt"
	"slices"
	"strings"

	"github.com/shardd/shardd/pkg/config"
)

// Roles of a token.
//
//   - read: the API's reads and the console's pages;
//   - write: also trigger, kill, disable, enable and remove;
//   - define: reads, and the definitions of jobs (apply, delete, rollback:
//     the code every host that accepts applied definitions runs). It
//     implies neither write nor write implies it: defining what runs on
//     the hosts is a separate, audited right.
const (
	RoleRead   = "read"
	RoleWrite  = "write"
	RoleDefine = "define"
)

// Token is one named bearer token.
type Token struct {
	Name   string
	Role   string
	Secret string
}

// MinSecret is the shortest secret a token may have.
const MinSecret = 16

// ParseTokens reads a token file. Each line that is not blank or a
// comment (#) is either
//
//	NAME ROLE SECRET     a named token: ROLE is read, write or define
//	SECRET               a token of the file's default name and role
//
// (the second form is the one-token file of earlier versions: only its
// first such line counts, as before). Names are job-name-like and unique;
// secrets are at least MinSecret characters and unique.
func ParseTokens(text, file, defaultName, defaultRole string) ([]Token, error) {
	var out []Token
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	bare := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		var t Token
		switch len(f) {
		case 1:
			if bare {
				continue // the old format: the first line is the token
			}
			bare, t = true, Token{Name: defaultName, Role: defaultRole, Secret: f[0]}
		case 3:
			t = Token{Name: f[0], Role: f[1], Secret: f[2]}
		default:
			return nil, fmt.Errorf("%s:%d: want NAME ROLE SECRET (or a lone SECRET), got %d fields", file, n, len(f))
		}
		if err := config.CheckName(t.Name); err != nil {
			return nil, fmt.Errorf("%s:%d: token name %v", file, n, err)
		}
		if t.Role != RoleRead && t.Role != RoleWrite && t.Role != RoleDefine {
			return nil, fmt.Errorf("%s:%d: token %q: role must be read, write or define, got %q", file, n, t.Name, t.Role)
		}
		if len(t.Secret) < MinSecret {
			return nil, fmt.Errorf("%s:%d: token %q: the secret must be at least %d characters", file, n, t.Name, MinSecret)
		}
		for _, o := range out {
			if o.Name == t.Name {
				return nil, fmt.Errorf("%s:%d: token name %q is used twice", file, n, t.Name)
			}
			if o.Secret == t.Secret {
				return nil, fmt.Errorf("%s:%d: token %q has the same secret as token %q", file, n, t.Name, o.Name)
			}
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return out, nil
}

// tokens finds the token of a secret.
type tokens []Token

// lookup returns the token whose secret is s, comparing in constant time
// against every token.
func (ts tokens) lookup(s string) (Token, bool) {
	var found Token
	ok := 0
	for _, t := range ts {
		if subtle.ConstantTimeCompare([]byte(s), []byte(t.Secret)) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1 && s != ""
}

func (ts tokens) has(role string) bool {
	return slices.ContainsFunc(ts, func(t Token) bool { return t.Role == role })
}
