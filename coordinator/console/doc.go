// Package console is the coordinator's web console: read-only HTML pages
// on the admin address (under /console/) showing the fleet's nodes, the
// running and recent jobs with live output, the sandbox ledger by run and
// node with its leases and reaps, and the audit log.
//
// The pages are rendered on the server with html/template (so every value
// a node, job or caller supplied is escaped), from templates and one
// stylesheet embedded in the binary; one small script, served from the
// same origin, polls a job's output endpoint to append live output. There
// is no build step and nothing is fetched from elsewhere: the Content
// Security Policy allows only this origin.
//
// # What it reads
//
// Everything comes from the coordinator's own read paths (Config): the
// node registry (Fleet.FleetNodes), the job store (Jobs), a detached job's
// output through the node's tunnel (Fleet.JobOutput, nodes connected to
// this coordinator only), the sandbox ledger and its leases (Ledger), and
// the audit stream (Audit). The console stores nothing of its own except
// one random key per process for its session cookies.
//
// # Who may read what
//
// Every request is attributed to an identity the transport proved, and
// decided by the coordinator's policy exactly as the NATS API decides the
// same read:
//
//   - nodes: nodes.list, per node (a listing leaves out the nodes not
//     granted);
//   - jobs: job.status on every node of a job, with the job's owner (scope
//     own or any); a job's output: job.logs the same way;
//   - sandboxes and leases: sandboxes.list (scope own shows the caller's
//     runs and the sandboxes it created, scope any everything);
//   - audit: admin.
//
// A caller with no identity gets 401 and a login form; one the policy
// does not know, or that may not read a page, gets 403 naming what is
// missing. Requests count against the identity's requests_per_second like
// API requests (429 past it), and each page read and login is an audit
// event (audit.go). The console has no write actions at all.
//
// # Identities
//
// In order:
//
//  1. A bearer token (Authorization: Bearer TOKEN) that Config.Tokens
//     names: identity token:NAME, as the facades' tokens.
//  2. A session cookie from the login exchange: GET
//     /console/login?token=TOKEN or POST /console/login (form field
//     token) checks the token (constant time, Config.Tokens) and answers
//     303 to the console with a cookie tether_console: HttpOnly, Secure,
//     SameSite=Strict, Path=/console/, lasting Config.SessionTTL. Its value
//     is NAME.SID.EXPIRY.MAC: the token's name, a 96-bit random session id
//     of this login, the expiry, MACed (HMAC-SHA256) with the process's
//     random key, read strictly (four fields, raw base64url, exact
//     lengths, else 401): it never holds the token, each login is its own
//     session, a restart ends every session, /console/logout ends that
//     one on the server (its session id is refused
//     until the cookie's expiry; past 1024 ended sessions of one token
//     that are unexpired, all of that token's sessions so far end, and no
//     other token's), and a forged, expired or ended cookie is
//     401 (errBadSession), never the loopback user. The exchange is
//     refused unless the connection is TLS or loopback (a token must not
//     cross a network in clear text), and a login with a token (either
//     method), any POST to it and a /console/logout that a page of
//     another site sent (Sec-Fetch-Site other than same-origin or none; an
//     Origin, or without Sec-Fetch-Site a Referer, of another origin) is
//     refused with 403 (login CSRF). The pages themselves are GETs that change
//     nothing, and SameSite=Strict keeps the cookie off other sites'
//     requests.
//  3. The local user of a loopback caller without credentials
//     (Config.Local: the uid owning the caller's socket, as the facades on
//     loopback name it, token:loopback-uid-UID), when its Host names the
//     console: localhost, 127.0.0.0/8, ::1, the connection's local IP or
//     a Config.AllowedHosts name (--facade-allowed-hosts; the facades'
//     checker, coordinator/facade/hostcheck). Any other Host is 421
//     Misdirected Request (audit reason host), never the identity: a web
//     page on evil.example whose name resolves to 127.0.0.1 (DNS
//     rebinding) reaches the console over loopback from a browser on
//     this host, and its browser sends Host: evil.example. A credential
//     names the console by any Host (a rebinding page has none). A
//     request carrying Forwarded, X-Forwarded-For, -Host, -Proto,
//     X-Real-IP or Via never gets it (401): a proxy on the coordinator's
//     host connects over loopback for every caller it forwards. A nil
//     Local (the coordinator's --console-no-loopback) turns it off.
//
// Credentials travel only over TLS or loopback. A bearer token or session
// cookie on a plain-HTTP connection from another host is refused with 403
// (audit reason clear_text) before it is checked, exactly as the login
// exchange refuses a token there; a live session cookie refused so is
// revoked on sight (whoever saw it on the wire must not use it later from
// loopback either), and the refusal says so. The admin listener serves plain HTTP,
// so a remote browser reaches the console through a TLS proxy on the
// coordinator's host (one that adds X-Forwarded-For, or with
// --console-no-loopback: Identities, 3) or an SSH tunnel. The admin address's other paths
// (/metrics, /healthz, /readyz) take no credentials.
//
// Handler is safe for concurrent use. Its one lock of its own, the
// sessions' (auth.go: the MAC key and what logout ended, under one
// lock), is never held while the policy store's is taken.
package console
