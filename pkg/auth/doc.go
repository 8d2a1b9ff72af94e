// Package auth decides who makes a request to shardd's HTTP server (the
// API and the console) and what the request may do. pkg/api and
// pkg/console ask it (Authority) and choose the answer; the threats and
// the reasons are in docs/security.md ("The HTTP API", "Console
// sessions").
//
// Who may do what. A request is made by one of the named tokens of the
// token files (tokens.go), given as a bearer token (API) or through a
// console session (sessions.go: made at login from a token, a cookie and
// a key). A token's role is read (see everything) or write (also act).
// Reads need a token only when some token has the read role; writes
// always need a write token, and are refused by an instance that has
// none. The caller rides in the request's context (caller.go) to the
// audit log, which names its token, never its secret.
//
// What it guards against:
//
//   - a guessed secret: secrets are compared in constant time against
//     every token (no timing tells how much of a guess was right), and a
//     token file's are at least MinSecret characters; console logins are
//     rate-limited per source address and on the instance before the
//     secret is looked at (limit.go); bearer tokens are not;
//   - a session cookie replayed by another local user's server (the
//     browser sends it to every port of the host): the cookie is half a
//     session, worthless without the key, which only the console's own
//     origin holds;
//   - a page of another origin acting through the operator's browser
//     (CSRF): the key, a SameSite=Strict cookie, and the refusal of
//     cross-origin writes, logins and logouts (csrf.go);
//   - one token's holder logging out the users of another: each token
//     has at most a bounded number of sessions, and a login beyond it
//     ends that token's oldest.
//
// How it fails:
//
//   - ParseTokens: an error naming the file, the line and the token (a
//     bad role, a short or shared secret, a name used twice);
//   - Identify: an error for an Authorization header that is not
//     "Bearer TOKEN" or a secret of no token (the API answers 401); a
//     session cookie without its key, with another key, or of no live
//     session is no caller and no error (anonymous: 401 where a token is
//     needed);
//   - Login: a *LimitError when the rate of logins is spent (429 with
//     Retry-After), else an error when no token has the secret;
//   - CrossOrigin: true for a request with the Origin of another page
//     (the API answers 403 to a write, the console to a login or logout).
//
// Sessions live in memory: a restart logs everyone out.
package auth
