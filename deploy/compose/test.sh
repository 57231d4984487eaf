#!/usr/bin/env bash
# test.sh — bring up deploy/compose/docker-compose.yml (with the test-only
# docker-compose.test.yml: a fake OpenSandbox server behind agent-1) from the
# local images and check that the fleet works as the file's header says:
#
#   - all three agents enroll, each with its own single-use join token, and
#     show in `tether nodes`;
#   - no agent container holds a secret it does not need: none mounts the
#     coordinator's data volume, and no file in any agent container is named
#     like or contains the CA key, the facade token or the NATS seeds;
#   - `tether exec --all` fans out to all three, as the policy's user;
#   - an agent whose container is stopped is reported gone (`tether nodes`,
#     `exec --node`, `exec --all`), and re-registers with a new session when
#     started again;
#   - the fake sandbox server behind agent-1 is reachable through the
#     coordinator's OpenSandbox facade (create, get, a command through the
#     execd proxy, delete), the ledger records it, and the facade refuses a
#     caller without the token or with a wrong one, and a create on a node
#     with no sandbox server;
#   - the token service's NATS user may do nothing but admin, and the audit
#     log names who did what.
#
# Run by `make compose-test`, which builds bin/tether, bin/opensandbox-fake
# and the images first. Each phase's duration is logged.
#
# Env: COMPOSE (default: docker-compose, else `docker compose`), TETHER
# (default bin/tether), FAKE (default bin/opensandbox-fake),
# COMPOSE_TEST_TIMEOUT seconds to wait for each state (default 180), KEEP=1
# leaves the fleet up for inspection. The project name and host ports are
# this run's own, so it never touches a fleet already up.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tether=${TETHER:-$repo/bin/tether}
fake=${FAKE:-$repo/bin/opensandbox-fake}
timeout=${COMPOSE_TEST_TIMEOUT:-180}

if [ -z "${COMPOSE:-}" ]; then
	if command -v docker-compose >/dev/null 2>&1; then COMPOSE=docker-compose
	elif docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"
	else echo "compose-test: neither docker-compose nor docker compose is installed" >&2; exit 2; fi
fi
[ -x "$tether" ] || { echo "compose-test: $tether is missing: run make build" >&2; exit 2; }
# The override mounts the fake from bin/; a missing file would be mounted as
# an empty directory.
[ -x "$fake" ] && [ "$fake" -ef "$repo/bin/opensandbox-fake" ] ||
	{ echo "compose-test: $repo/bin/opensandbox-fake is missing: run make compose-test (or go build -o bin/opensandbox-fake ./deploy/compose/opensandbox-fake)" >&2; exit 2; }
command -v curl >/dev/null 2>&1 || { echo "compose-test: curl is not installed" >&2; exit 2; }
command -v python3 >/dev/null 2>&1 || { echo "compose-test: python3 is not installed" >&2; exit 2; }

export COMPOSE_PROJECT_NAME=tether-compose-test-$$
# Free host ports for this run's published NATS, HTTP and facade.
read -r nats_port http_port osb_port < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])' 2>/dev/null || echo "$((20000 + $$ % 10000)) $((40000 + $$ % 10000)) $((30000 + $$ % 10000))")
export TETHER_NATS_PORT=$nats_port TETHER_HTTP_PORT=$http_port TETHER_OPENSANDBOX_PORT=$osb_port

work=$(mktemp -d "${TMPDIR:-/tmp}/tether-compose-test.XXXXXX")
dc() { $COMPOSE -f "$here/docker-compose.yml" -f "$here/docker-compose.test.yml" "$@"; }
log() { printf 'compose-test: %s\n' "$*" >&2; }
cleanup() {
	rc=$?
	if [ "$rc" != 0 ]; then
		log "FAILED (exit $rc); the services' logs:"
		dc logs --no-color --tail=40 >&2 || true
		# Again last, so that a log tail (CI keeps only the end) shows why.
		log "FAILED (exit $rc): ${failure:-a command failed under set -e}"
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
# A command that fails under set -e (not a fail call) is named too.
trap '[ -n "$failure" ] || failure="line $LINENO: $BASH_COMMAND (exit $?)"' ERR
failure=
fail() { failure="FAIL: $*"; log "$failure"; exit 1; }

phase_start=$SECONDS
phase() { # phase NAME: log how long the previous phase took
	log "phase done in $((SECONDS - phase_start))s: $1"
	phase_start=$SECONDS
}

wait_for() { # wait_for WHAT CMD...: poll CMD until it succeeds, at most $timeout s
	local what=$1 deadline=$((SECONDS + timeout)); shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${timeout}s waiting for $what"
		sleep 1
	done
}

log "up: project $COMPOSE_PROJECT_NAME, NATS on 127.0.0.1:$nats_port, OpenSandbox facade on 127.0.0.1:$osb_port"
dc up -d
phase "compose up (the token service minted three join tokens)"

for svc in policy join-dirs token; do
	code=$(dc ps -q "$svc" | xargs docker inspect -f '{{.State.ExitCode}}')
	[ "$code" = 0 ] || fail "the $svc service exited $code, not 0"
done

# The host's client user, minted as the header says.
mint_admin() { (umask 077; dc exec -T coordinator /tether nats user create compose-admin --data-dir /data -o - >"$work/admin.creds" 2>/dev/null) && [ -s "$work/admin.creds" ]; }
wait_for "the coordinator's NATS layout" mint_admin

export TETHER_NATS_URL=nats://127.0.0.1:$nats_port TETHER_NATS_CREDS=$work/admin.creds
agents=(agent-1 agent-2 agent-3)
listed() { # listed NODE...: all of them are in tether nodes now
	"$tether" nodes >"$work/nodes" 2>"$work/nodes.err" || return 1
	local n
	for n in "$@"; do grep -q "^$n " "$work/nodes" || return 1; done
}
wait_for "${agents[*]} in tether nodes" listed "${agents[@]}"
cat "$work/nodes" >&2
phase "three agents enrolled"

# --- secrets: what the agent containers can read -------------------------
# The secrets, read by a throwaway container on the coordinator's volume
# (the test's privilege, not an agent's).
coord_cat() { dc run --rm --no-deps -T --entrypoint /bin/cat token "$@" 2>/dev/null; }
coord_cat /data/facade-token >"$work/facade-token" || fail "could not read the facade token"
coord_cat /data/pki/ca.crt >"$work/ca.crt" || fail "could not read the CA certificate"
coord_cat /data/pki/ca.key >"$work/ca.key" || fail "could not read the CA key"
facade_token=$(tr -d '\n' <"$work/facade-token")
[ ${#facade_token} -ge 16 ] || fail "the facade token is only ${#facade_token} characters"
# A line of the key's base64 body: no other file has it.
ca_key_line=$(sed -n 2p "$work/ca.key")
[ ${#ca_key_line} -ge 32 ] || fail "no base64 body line in ca.key"
coord_volume=$(dc ps -q coordinator | xargs docker inspect -f '{{range .Mounts}}{{if eq .Destination "/data"}}{{.Name}}{{end}}{{end}}')
[ -n "$coord_volume" ] || fail "the coordinator has no /data volume"
for a in "${agents[@]}"; do
	cid=$(dc ps -q "$a")
	mounts=$(docker inspect -f '{{range .Mounts}}{{if .Name}}{{.Name}}{{else}}{{.Source}}{{end}}={{.Destination}} {{end}}' "$cid")
	[[ " $mounts" != *" $coord_volume="* ]] || fail "$a mounts the coordinator's data volume: $mounts"
	# By name, anywhere in the container's file system ...
	named=$(docker exec "$cid" find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f \
		\( -name ca.key -o -name server.key -o -name facade-token -o -name '*.nk' -o -name '*.creds' \) -print 2>/dev/null || true)
	[ -z "$named" ] || fail "$a can read secret-named files: $named"
	# ... and by content, whatever the name: one search for the secrets and
	# for the agent's own join token, which it must find, or the search
	# proves nothing. grep's status is not used (2 for an unreadable special
	# file): what it prints is, one PATH:MATCH a line (-a: binary files too).
	own_token=$(docker exec "$cid" cat /etc/tether-join/join-token)
	[ ${#own_token} -ge 16 ] || fail "$a's join token is only ${#own_token} characters"
	hits=$(docker exec "$cid" grep -rsoaF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev \
		-e "$facade_token" -e "$ca_key_line" -e "$own_token" / 2>/dev/null || true)
	leaked=$(grep -F -e ":$facade_token" -e ":$ca_key_line" <<<"$hits" | cut -d: -f1 | sort -u || true)
	[ -z "$leaked" ] || fail "$a holds the facade token or the CA key in: $leaked"
	grep -qxF "/etc/tether-join/join-token:$own_token" <<<"$hits" ||
		fail "$a: the content search does not find the agent's own join token: it cannot vouch for the others"
	# It does hold what it needs: the CA certificate and its own identity.
	[ "$(docker exec "$cid" sha256sum /etc/tether-join/ca.crt | cut -d' ' -f1)" = "$(sha256sum <"$work/ca.crt" | cut -d' ' -f1)" ] ||
		fail "$a's CA certificate is not the coordinator's"
	docker exec "$cid" test -s /var/lib/tether-agent/identity/node.pem || fail "$a has no node certificate"
	log "$a: no coordinator volume, no CA key, no facade token, no NATS seeds (mounts: $mounts)"
done
# Each join token is its own: three different tokens.
tokens=$(for a in "${agents[@]}"; do docker exec "$(dc ps -q "$a")" cat /etc/tether-join/join-token; echo; done | sort -u | grep -c .)
[ "$tokens" = 3 ] || fail "the agents share join tokens: $tokens distinct of 3"
phase "secrets checked on every agent"

# --- fan-out --------------------------------------------------------------
exec_all() { # exec_all NODE...: exec --all runs on exactly these nodes, as root
	local out want got
	out=$("$tether" exec --all -- id -un) || fail "tether exec --all failed: $out"
	printf '%s\n' "$out" >&2
	want=$(printf '%s | root\n' "$@" | sort)
	got=$(sort <<<"$out")
	[ "$got" = "$want" ] || fail "exec --all answered $(tr '\n' ';' <<<"$got"), want $(tr '\n' ';' <<<"$want")"
}
exec_all "${agents[@]}"
phase "exec --all on three agents"

# --- an agent goes away and comes back -----------------------------------
session_of() { "$tether" nodes --json | python3 -c 'import json,sys
for n in json.load(sys.stdin)["nodes"]:
    if n["id"] == sys.argv[1]: print(n["session_id"])' "$1"; }
old_session=$(session_of agent-3)
[ -n "$old_session" ] || fail "agent-3 has no session id"
dc stop -t 30 agent-3
gone() { "$tether" nodes >"$work/nodes" 2>&1 && ! grep -q '^agent-3 ' "$work/nodes"; }
wait_for "agent-3 to leave tether nodes" gone
if out=$("$tether" exec --node agent-3 -- true 2>&1); then fail "exec on the stopped agent-3 succeeded: $out"; fi
grep -q 'agent-3' <<<"$out" || fail "the refusal of exec on agent-3 does not name it: $out"
log "agent-3 stopped: gone from tether nodes; exec --node agent-3: $out"
exec_all agent-1 agent-2
phase "agent-3 stopped and reported gone"
dc start agent-3
wait_for "agent-3 back in tether nodes" listed agent-3
new_session=$(session_of agent-3)
[ -n "$new_session" ] && [ "$new_session" != "$old_session" ] ||
	fail "agent-3 came back with session '$new_session', the old one was '$old_session'"
exec_all "${agents[@]}"
phase "agent-3 restarted and re-registered (session $old_session -> $new_session)"

# --- the sandbox fake behind agent-1, through the facade ------------------
facade=https://coordinator:$osb_port
fcurl() { # fcurl [curl args]: a request to the facade; prints the body, then the status on its own line
	curl -sS --max-time 30 --resolve "coordinator:$osb_port:127.0.0.1" --cacert "$work/ca.crt" \
		-w '\n%{http_code}' "$@"
}
split() { # split: $body and $status from fcurl's output on stdin
	local all; all=$(cat)
	status=${all##*$'\n'}
	body=${all%$'\n'*}
}
create_body='{"image":{"uri":"python:3.12"},"entrypoint":["tail","-f","/dev/null"],"timeout":600,"resourceLimits":{"cpu":"1"},"metadata":{"nemo-gym.nvidia.com/run":"compose-test"}}'
# The fake may still be starting, and agent-1's target found only then.
create() { fcurl -X POST -H "Tether-Token: $facade_token" -H 'Content-Type: application/json' -H 'Tether-Node: agent-1' \
	--data "$create_body" "$facade/v1/sandboxes" >"$work/create" 2>&1 && split <"$work/create" && [ "$status" = 202 ]; }
wait_for "a sandbox created on agent-1 through the facade (last answer: $(cat "$work/create" 2>/dev/null))" create
id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$body") || fail "create answered no id: $body"
log "created sandbox $id on agent-1 through the facade"

split < <(fcurl -H "Tether-Token: $facade_token" "$facade/v1/sandboxes/$id")
[ "$status" = 200 ] && grep -q "\"$id\"" <<<"$body" || fail "get $id through the facade: $status $body"

# A command through the facade's execd proxy, into the fake's execd.
split < <(fcurl -H "Tether-Token: $facade_token" "$facade/v1/sandboxes/$id/endpoints/44772?use_server_proxy=true")
[ "$status" = 200 ] || fail "endpoint of $id: $status $body"
endpoint=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["endpoint"])' "$body")
[[ "$endpoint" == *"/sandboxes/$id/proxy/44772" ]] || fail "endpoint $endpoint does not point at the facade's proxy"
split < <(fcurl -X POST -H "Tether-Token: $facade_token" -H 'Content-Type: application/json' \
	--data '{"command":"echo compose-sandbox-says-hi","timeout":30000}' "$facade/sandboxes/$id/proxy/44772/command")
[ "$status" = 200 ] && grep -q 'compose-sandbox-says-hi' <<<"$body" || fail "command through the facade: $status $body"

# The ledger knows where it is.
"$tether" sandboxes --json >"$work/sandboxes" || fail "tether sandboxes failed: $(cat "$work/sandboxes")"
python3 - "$id" "$work/sandboxes" <<'EOF' || fail "the ledger has no live record of $id on agent-1: $(cat "$work/sandboxes")"
import json, sys
sid, path = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
recs = doc.get("sandboxes", doc) if isinstance(doc, dict) else doc
ok = any(r.get("id") == sid and r.get("node") == "agent-1" for r in recs)
sys.exit(0 if ok else 1)
EOF

# Refusals: no token; a wrong token; a node without the sandbox target.
split < <(fcurl "$facade/v1/sandboxes/$id")
[ "$status" = 401 ] || [ "$status" = 403 ] || fail "the facade answered $status to a caller without a token: $body"
split < <(fcurl -H "Tether-Token: not-the-token-not-the-token" "$facade/v1/sandboxes/$id")
[ "$status" = 401 ] || [ "$status" = 403 ] || fail "the facade answered $status to a wrong token: $body"
split < <(fcurl -X POST -H "Tether-Token: $facade_token" -H 'Content-Type: application/json' -H 'Tether-Node: agent-2' \
	--data "$create_body" "$facade/v1/sandboxes")
case $status in 4??|5??) log "create on agent-2 (no OpenSandbox server) refused: $status $body" ;; *) fail "a create on agent-2 (no OpenSandbox server) answered $status: $body" ;; esac

split < <(fcurl -X DELETE -H "Tether-Token: $facade_token" "$facade/v1/sandboxes/$id")
[ "$status" = 204 ] || fail "delete $id through the facade: $status $body"
split < <(fcurl -H "Tether-Token: $facade_token" "$facade/v1/sandboxes/$id")
[ "$status" = 404 ] || fail "get of the deleted $id answered $status: $body"
phase "OpenSandbox fake behind agent-1 reached through the facade"

# --- the token service's user, and the audit log --------------------------
# The token service's user is granted admin only: it may not run jobs.
coord_cat /data/compose/token.creds >"$work/token.creds" || fail "could not read the token service's credentials"
chmod 600 "$work/token.creds"
if refused=$(TETHER_NATS_CREDS=$work/token.creds "$tether" exec --all -- id 2>&1); then
	fail "the compose-token user could run a job: $refused"
fi
grep -q 'compose-token' <<<"$refused" || fail "the refusal does not name the identity: $refused"
log "compose-token refused exec: $refused"

audit=$("$tether" audit --since 10m --json) || fail "tether audit failed: $audit"
grep -q '"identity":"nats:compose-token"' <<<"$audit" || fail "no audit event of nats:compose-token (its token creates)"
grep -q '"identity":"nats:compose-admin"' <<<"$audit" || fail "no audit event of nats:compose-admin"
grep -q '"identity":"token:facade"' <<<"$audit" || fail "no audit event of token:facade (the facade's caller)"
phase "policy and audit"

log "ok: three agents enrolled with their own tokens and no coordinator secret, exec --all on all three, agent-3 reported gone and re-registered, the sandbox fake behind agent-1 served through the facade, compose-token limited to admin, audit attributed"
