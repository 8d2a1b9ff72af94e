package auth

import (
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	const s1, s2 = "0123456789abcdef", "fedcba9876543210"
	tests := []struct {
		name, text string
		want       []Token
		err        string
	}{
		{"bare token (the old format)", s1 + "\n", []Token{{"default", RoleWrite, s1}}, ""},
		{"bare token: only the first line counts", s1 + "\n" + s2 + "\n", []Token{{"default", RoleWrite, s1}}, ""},
		{"named tokens and comments", "# who role secret\nalice write " + s1 + "\n\n  bob read " + s2 + "  \n", []Token{{"alice", RoleWrite, s1}, {"bob", RoleRead, s2}}, ""},
		{"the define role", "dana define " + s1 + "\n", []Token{{"dana", RoleDefine, s1}}, ""},
		{"empty file", "# nothing\n", nil, ""},
		{"bad role", "alice admin " + s1, nil, `tokens:1: token "alice": role must be read, write or define, got "admin"`},
		{"short secret", "alice write short", nil, `tokens:1: token "alice": the secret must be at least 16 characters`},
		{"two fields", "alice " + s1, nil, "tokens:1: want NAME ROLE SECRET (or a lone SECRET), got 2 fields"},
		{"name twice", "a write " + s1 + "\na read " + s2, nil, `tokens:2: token name "a" is used twice`},
		{"secret twice", "a write " + s1 + "\nb read " + s1, nil, `tokens:2: token "b" has the same secret as token "a"`},
		{"bad name", "a/b write " + s1, nil, "tokens:1: token name"},
	}
	for _, tt := range tests {
		got, err := ParseTokens(tt.text, "tokens", "default", RoleWrite)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Errorf("%s: %v, %v; want %v", tt.name, got, err, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: token %d = %+v, want %+v", tt.name, i, got[i], tt.want[i])
			}
		}
	}
}
