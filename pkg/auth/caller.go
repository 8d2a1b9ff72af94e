package auth

import "context"

// Caller is who made a request.
type Caller struct {
	Token Token
	// Session is set when the request came with a console session: its
	// cookie and its key.
	Session bool
}

// Actor names the caller in the audit log.
func (c *Caller) Actor() string {
	if c == nil {
		return "anonymous"
	}
	return "token:" + c.Token.Name
}

type callerKey struct{}

// CallerOf returns who made r, nil when no token or session came with it.
func CallerOf(ctx context.Context) *Caller {
	c, _ := ctx.Value(callerKey{}).(*Caller)
	return c
}

// WithCaller returns ctx carrying c (see CallerOf).
func WithCaller(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}
