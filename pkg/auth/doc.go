// Package auth: who may do what. A request is made by one of the named tokens of the
// token files, given as a bearer token (API) or through a console session
// (made at login from a token: a cookie and a key, see below). A token's
// role is read (see everything) or write (also act). Reads need a token
// only when some token has the read role; writes always need a write
// token, and are refused by an instance that has none.
package auth
