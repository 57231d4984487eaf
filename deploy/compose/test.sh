#!/usr/bin/env bash
# test.sh — bring up deploy/compose/docker-compose.yml from the local images
# and check that the fleet works as the file's header says: both agents
# enroll and show in `tether nodes`, `tether exec --all` runs on both as the
# policy's user, the token service's NATS user may do nothing but admin, and
# the audit log names who did what. Run by `make compose-test`, which builds
# bin/tether and the images first.
#
# Env: COMPOSE (default: docker-compose, else `docker compose`), TETHER
# (default bin/tether), COMPOSE_TEST_TIMEOUT seconds to wait for the fleet
# (default 180), KEEP=1 leaves the fleet up for inspection. The project name
# and host ports are this run's own, so it never touches a fleet already up.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tether=${TETHER:-$repo/bin/tether}
timeout=${COMPOSE_TEST_TIMEOUT:-180}

if [ -z "${COMPOSE:-}" ]; then
	if command -v docker-compose >/dev/null 2>&1; then COMPOSE=docker-compose
	elif docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"
	else echo "compose-test: neither docker-compose nor docker compose is installed" >&2; exit 2; fi
fi
[ -x "$tether" ] || { echo "compose-test: $tether is missing: run make build" >&2; exit 2; }

export COMPOSE_PROJECT_NAME=tether-compose-test-$$
# Free host ports for this run's published NATS and HTTP.
read -r nats_port http_port < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])' 2>/dev/null || echo "$((20000 + $$ % 20000)) $((40000 + $$ % 20000))")
export TETHER_NATS_PORT=$nats_port TETHER_HTTP_PORT=$http_port

work=$(mktemp -d "${TMPDIR:-/tmp}/tether-compose-test.XXXXXX")
dc() { $COMPOSE -f "$here/docker-compose.yml" "$@"; }
log() { printf 'compose-test: %s\n' "$*" >&2; }
cleanup() {
	rc=$?
	if [ "$rc" != 0 ]; then
		log "FAILED (exit $rc); the services' logs:"
		dc logs --no-color --tail=40 >&2 || true
	fi
	if [ "${KEEP:-0}" = 1 ]; then
		log "KEEP=1: left up as project $COMPOSE_PROJECT_NAME (NATS 127.0.0.1:$nats_port, creds $work/admin.creds)"
	else
		dc down -v --remove-orphans >/dev/null 2>&1 || true
		rm -rf "$work"
	fi
	exit "$rc"
}
trap cleanup EXIT
fail() { log "FAIL: $*"; exit 1; }

log "up: project $COMPOSE_PROJECT_NAME, NATS on 127.0.0.1:$nats_port"
dc up -d

deadline=$((SECONDS + timeout))
wait_for() { # wait_for WHAT CMD...: poll CMD until it succeeds or the deadline
	local what=$1; shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${timeout}s waiting for $what"
		sleep 1
	done
}

# The host's client user, minted as the header says.
mint_admin() { (umask 077; dc exec -T coordinator /tether nats user create compose-admin --data-dir /data -o - >"$work/admin.creds" 2>/dev/null) && [ -s "$work/admin.creds" ]; }
wait_for "the coordinator's NATS layout" mint_admin

export TETHER_NATS_URL=nats://127.0.0.1:$nats_port TETHER_NATS_CREDS=$work/admin.creds
both_enrolled() {
	"$tether" nodes >"$work/nodes" 2>"$work/nodes.err" || return 1
	grep -q '^agent-1 ' "$work/nodes" && grep -q '^agent-2 ' "$work/nodes"
}
wait_for "agent-1 and agent-2 in tether nodes" both_enrolled
cat "$work/nodes" >&2

[ "$(dc ps -q token | xargs docker inspect -f '{{.State.ExitCode}}')" = 0 ] || fail "the token service did not exit 0"

out=$("$tether" exec --all -- id -un) || fail "tether exec --all failed: $out"
printf '%s\n' "$out" >&2
grep -qx 'agent-1 | root' <<<"$out" || fail "no 'agent-1 | root' from exec: $out"
grep -qx 'agent-2 | root' <<<"$out" || fail "no 'agent-2 | root' from exec: $out"

# The token service's user is granted admin only: it may not run jobs.
dc run --rm --no-deps -T --entrypoint /bin/cat token /data/compose/token.creds >"$work/token.creds" 2>/dev/null ||
	fail "could not read the token service's credentials"
chmod 600 "$work/token.creds"
if refused=$(TETHER_NATS_CREDS=$work/token.creds "$tether" exec --all -- id 2>&1); then
	fail "the compose-token user could run a job: $refused"
fi
grep -q 'compose-token' <<<"$refused" || fail "the refusal does not name the identity: $refused"
log "compose-token refused exec: $refused"

audit=$("$tether" audit --since 10m --json) || fail "tether audit failed: $audit"
grep -q '"identity":"nats:compose-token"' <<<"$audit" || fail "no audit event of nats:compose-token (its token create)"
grep -q '"identity":"nats:compose-admin"' <<<"$audit" || fail "no audit event of nats:compose-admin"

log "ok: both agents enrolled, exec ran on both as root, compose-token limited to admin, audit attributed"
