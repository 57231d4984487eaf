#!/usr/bin/env bash
# ha-smoke.sh — run deploy/k8s/ha's pods as docker containers and check that
# the install works as its README says: three NATS servers form a cluster
# from the manifest's config (authenticated routes, Tether's layout,
# JetStream), both coordinators connect to it with the manifest's args
# (their credentials and the layout's public JWTs, no seeds), agents of the
# DaemonSet enroll through the coordinators' Service and run jobs, an agent
# whose coordinator stops moves to the other one, and the NATS client port
# refuses a connection without credentials.
#
# There is no cluster in CI: ha-smoke.py reads the manifests and prints each
# pod's args, env, user, mounts and DNS names; this script writes the
# Secrets and ConfigMaps the README has the operator create (a fresh layout,
# node CA and certificates from bin/tether), and starts the pods on one
# docker network, nats-server from the agent base image with the
# nats-server binary of go.mod (no image can be pulled). Run by `make
# k8s-smoke`, which builds what it needs; part of `make ci-compose`.
#
# Env: TETHER (bin/tether), NATS_SERVER (bin/nats-server), COORD_IMAGE,
# AGENT_IMAGE, AGENT_BASE (the images `make docker` built), TIMEOUT seconds
# per wait (120), KEEP=1 leaves everything up.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tether=${TETHER:-$repo/bin/tether}
nats_server=${NATS_SERVER:-$repo/bin/nats-server}
coord_image=${COORD_IMAGE:-tether/coordinator:dev}
agent_image=${AGENT_IMAGE:-tether/agent:dev}
agent_base=${AGENT_BASE:-tether/agent-base:local}
timeout=${TIMEOUT:-120}

log() { printf 'k8s-smoke: %s\n' "$*" >&2; }
failure=
fail() { failure="FAIL: $*"; log "$failure"; exit 1; }
for f in "$tether" "$nats_server"; do [ -x "$f" ] || { log "$f is missing: run make k8s-smoke"; exit 2; }; done
for py in python3 /usr/bin/python3; do
	if "$py" -c 'import yaml' 2>/dev/null; then python=$py; break; fi
done
[ -n "${python:-}" ] || { log "no python3 with PyYAML (Debian: python3-yaml)"; exit 2; }

project=tether-ha-smoke-$$
work=$(mktemp -d "${TMPDIR:-/tmp}/tether-ha-smoke.XXXXXX")
cleanup() {
	rc=$?
	if [ "$rc" != 0 ]; then
		log "FAILED (exit $rc); the containers' logs:"
		for c in $(docker ps -aq --filter "label=$project"); do
			echo "--- $(docker inspect -f '{{.Name}}' "$c")" >&2
			docker logs --tail 25 "$c" 2>&1 | cut -c1-400 >&2 || true
		done
		# Again last, so that a log tail (CI keeps only the end) shows why.
		log "FAILED (exit $rc): ${failure:-a command failed under set -e}"
	fi
	if [ "${KEEP:-0}" = 1 ]; then
		log "KEEP=1: left up (label $project, network $project, files $work)"
	else
		docker ps -aq --filter "label=$project" | xargs -r docker rm -fv >/dev/null 2>&1 || true
		docker network rm "$project" >/dev/null 2>&1 || true
		rm -rf "$work"
	fi
	exit "$rc"
}
trap cleanup EXIT
# A command that fails under set -e (not a fail call) is named too.
trap '[ -n "$failure" ] || failure="line $LINENO: $BASH_COMMAND (exit $?)"' ERR

wait_for() { # wait_for WHAT CMD...
	local what=$1 deadline=$((SECONDS + timeout)); shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${timeout}s waiting for $what"
		sleep 1
	done
}

# --- what the operator creates (deploy/k8s/README.md, deploy/k8s/ha) -------
layout=$work/layout
obj=$work/plan/objects
mkdir -p "$obj"
put() { mkdir -p "$obj/$1"; cp "$3" "$obj/$1/$2"; }
"$tether" nats server-config --data-dir "$layout" >"$work/tether-layout.conf" 2>/dev/null
(umask 077
	"$tether" nats coordinator-creds coordinator --data-dir "$layout" -o "$work/coordinator.creds" >/dev/null
	"$tether" nats user create tether-admin --data-dir "$layout" -o "$work/tether.creds" >/dev/null)
cat >"$work/policy.yaml" <<'EOF'
version: 1
identities:
  nats:tether-admin:
    rules:
      - nodes: "*"
        operations: [exec, job.status, job.logs, job.cancel]
        scope: any
        run_as: root
      - nodes: "*"
        operations: [nodes.list]
      - operations: [admin]
EOF
chmod 600 "$work/policy.yaml"
# The node CA and the tunnel's certificate: a dev pair from a coordinator
# run once on loopback, as the README suggests.
"$tether" coordinator --data-dir "$layout" --tls-host tether-coordinator.tether.svc --policy "$work/policy.yaml" \
	--listen 127.0.0.1:0 --http-addr 127.0.0.1:0 --nats-listen 127.0.0.1:0 --openshell-listen "" --opensandbox-listen "" \
	>"$work/pki.log" 2>&1 &
pki_pid=$!
wait_for "the dev PKI" test -s "$layout/pki/server.key"
kill "$pki_pid"; wait "$pki_pid" || true
put tether-nats-layout tether-layout.conf "$work/tether-layout.conf"
put tether-nats-layout operator.jwt "$layout/nats-auth/operator.jwt"
put tether-nats-layout clients.jwt "$layout/nats-auth/account-CLIENTS.jwt"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/route-password"
put tether-nats-routes password "$work/route-password"
put tether-nats-creds coordinator.creds "$work/coordinator.creds"
put tether-node-ca ca.crt "$layout/pki/ca.crt"
put tether-node-ca ca.key "$layout/pki/ca.key"
put tether-coordinator-tls tls.crt "$layout/pki/server.crt"
put tether-coordinator-tls tls.key "$layout/pki/server.key"
put tether-ca ca.crt "$layout/pki/ca.crt"
put tether-policy policy.yaml "$work/policy.yaml"
# The join token is minted once the coordinators run; a placeholder makes
# the plan, and is replaced before any agent starts.
echo placeholder >"$work/join-token"
put tether-join-token join-token "$work/join-token"

"$python" "$here/ha-smoke.py" "$work/plan" >"$work/pods.jsonl"
roles=$("$python" -c 'import json,sys; print(" ".join(sorted(json.loads(l)["role"] for l in open(sys.argv[1]))))' "$work/pods.jsonl")
[ "$(grep -o nats <<<"$roles" | wc -l)" = 3 ] || fail "the plan has not 3 NATS pods: $roles"
[ "$(grep -o coordinator <<<"$roles" | wc -l)" -ge 2 ] || fail "the plan has fewer than 2 coordinators: $roles"

docker network create "$project" >/dev/null
nats_port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

run_pod() { # run_pod JSON: run one pod's init containers to completion, then start its container
	"$python" - "$1" "$project" "$coord_image" "$agent_image" "$agent_base" "$nats_server" "$nats_port" >"$work/run.sh" <<'EOF'
import json, shlex, sys
p = json.loads(sys.argv[1])
project, coord, agent, base, natsbin, port = sys.argv[2:8]

def docker_run(c, name, detach):
    cmd = ["docker", "run", "--name", name, "--label", project, "--network", project, "--hostname", c["name"]]
    cmd += ["-d"] if detach else []
    if c["read_only"]:
        cmd += ["--read-only"]
    for a in c["aliases"] if detach else []:
        cmd += ["--network-alias", a]
    if c["user"]:
        cmd += ["--user", c["user"]]
    for g in c["groups"]:
        cmd += ["--group-add", str(g)]
    for host, path, ro in c["mounts"]:
        cmd += ["-v", f"{host}:{path}" + (":ro" if ro else "")]
    for k, v in c["env"].items():
        cmd += ["-e", f"{k}={v}"]
    image = {"nats": base, "coordinator": coord, "agent": agent}[c["role"]]
    args = c["command"][1:] + c["args"]
    if c["role"] == "nats":
        # The official image's entrypoint is nats-server; none can be pulled.
        cmd += ["-v", f"{natsbin}:/usr/local/bin/nats-server:ro", "--entrypoint", "/usr/local/bin/nats-server"]
        if c["name"].endswith("-0") and detach:
            cmd += ["-p", f"127.0.0.1:{port}:4222"]
    elif c["command"]:
        cmd += ["--entrypoint", c["command"][0]]
    return " ".join(shlex.quote(x) for x in cmd + [image] + args)

print("set -e")
for j, c in enumerate(p["init"]):
    print(docker_run(c, f"{project}-{p['name']}-init-{j}", False))
print(docker_run(p, f"{project}-{p['name']}", True) + " >/dev/null")
EOF
	bash "$work/run.sh" </dev/null >&2 || fail "could not start $(cut -c1-80 <<<"$1")"
}

log "starting the NATS servers and the coordinators (network $project)"
role_of() { "$python" -c 'import json,sys; print(json.loads(sys.argv[1])["role"])' "$1"; }
while read -r pod; do
	[ "$(role_of "$pod")" = agent ] || run_pod "$pod"
done <"$work/pods.jsonl"

export TETHER_NATS_URL=nats://127.0.0.1:$nats_port TETHER_NATS_CREDS=$work/tether.creds
routes_up() { [ "$(docker logs "$project-tether-nats-0" 2>&1 | grep -c 'Route connection created')" -ge 2 ]; }
wait_for "NATS routes between the servers" routes_up
meta_leader() { # (grep -q ends the pipe early: pipefail would call that a failure)
	local logs
	logs=$(docker logs "$project-tether-nats-0" 2>&1; docker logs "$project-tether-nats-1" 2>&1; docker logs "$project-tether-nats-2" 2>&1)
	grep -q 'new JetStream cluster metadata leader\|JetStream cluster new metadata leader' <<<"$logs"
}
wait_for "a JetStream metadata leader" meta_leader
serving() { # every coordinator (at least two) logged "serving"
	local c n=0
	for c in $(docker ps -q --filter "label=$project" --filter "name=tether-coordinator"); do
		grep -q '"msg":"serving"' <<<"$(docker logs "$c" 2>&1)" || return 1
		n=$((n + 1))
	done
	[ "$n" -ge 2 ]
}
# The manifest's startupProbe gives a coordinator 150 s; a kubelet would
# restart one that never answers. Here: one that has not served 60 s after
# the first did is sent SIGQUIT (Go prints every goroutine's stack to its
# log, which the failure report shows) and started again, once, loudly
# (RESTART_AFTER=SECONDS changes the 60; 0 exercises the restart).
restarted=
kubelet_restart() {
	local c name
	for c in $(docker ps -q --filter "label=$project" --filter "name=tether-coordinator"); do
		grep -q '"msg":"serving"' <<<"$(docker logs "$c" 2>&1)" && continue
		name=$(docker inspect -f '{{.Name}}' "$c")
		log "WARNING: ${name#/} has not served ${RESTART_AFTER:-60} s after another did: its stacks (SIGQUIT), then a restart as a kubelet would do"
		docker kill -s QUIT "$c" >/dev/null || true
		sleep 2
		docker logs --tail 400 "$c" 2>&1 | grep -A12 '^goroutine .*\[\(select\|chan receive\|IO wait\|semacquire\)' | grep -E 'tetherfleet|nats-io' | sort | uniq -c | sort -rn | head -20 >&2 || true
		docker start "$c" >/dev/null
		restarted="$restarted ${name#/}"
	done
}
serving_or_restart() {
	serving && return 0
	if [ -z "$restarted" ] && [ -n "${first_serving:-}" ] && [ $((SECONDS - first_serving)) -ge "${RESTART_AFTER:-60}" ]; then
		kubelet_restart
	fi
	if [ -z "${first_serving:-}" ]; then
		for c in $(docker ps -q --filter "label=$project" --filter "name=tether-coordinator"); do
			if grep -q '"msg":"serving"' <<<"$(docker logs "$c" 2>&1)"; then first_serving=$SECONDS; break; fi
		done
	fi
	return 1
}
wait_for "the coordinators to serve" serving_or_restart
[ -z "$restarted" ] || log "WARNING: restarted (had not served):$restarted"
log "NATS cluster formed; coordinators serving"

mint() { (umask 077; "$tether" token create --uses 0 --ttl 1h >"$work/join-token" 2>/dev/null) && [ -s "$work/join-token" ]; }
wait_for "a join token through the NATS cluster" mint
for d in "$work"/plan/mounts/tether-agent-*/token; do cp "$work/join-token" "$d/join-token"; done
while read -r pod; do
	[ "$(role_of "$pod")" != agent ] || run_pod "$pod"
done <"$work/pods.jsonl"

listed() { [ "$("$tether" nodes 2>/dev/null | grep -c '^node-')" = 2 ]; }
wait_for "both agents in tether nodes" listed
"$tether" nodes >&2
out=$("$tether" exec --all -- id -un) || fail "exec --all: $out"
[ "$(grep -c '| root$' <<<"$out")" = 2 ] || fail "exec --all answered: $out"

# Stop the coordinator holding node-0: it moves to another one.
holder=$("$tether" nodes --json | "$python" -c 'import json,sys
print([n["coordinator"] for n in json.load(sys.stdin)["nodes"] if n["id"]=="node-0"][0])')
[ -n "$holder" ] || fail "node-0 has no coordinator"
docker stop -t 30 "$project-$holder" >/dev/null
moved() {
	local now
	now=$("$tether" nodes --json 2>/dev/null | "$python" -c 'import json,sys
print([n["coordinator"] for n in json.load(sys.stdin)["nodes"] if n["id"]=="node-0"][0])' 2>/dev/null) &&
		[ -n "$now" ] && [ "$now" != "$holder" ]
}
wait_for "node-0 to move off $holder" moved
out=$("$tether" exec --node node-0 -- true 2>&1) || fail "exec on node-0 after the move: $out"
log "node-0 moved off the stopped $holder and runs jobs"

# No credentials, no entry: the client port of every server.
for i in 0 1 2; do
	ip=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$project\").IPAddress}}" "$project-tether-nats-$i")
	ans=$("$python" - "$ip" <<'EOF'
import socket, sys
s = socket.create_connection((sys.argv[1], 4222), timeout=10)
f = s.makefile("rb")
info = f.readline()
s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
try:
    print(info.decode().split('"auth_required":')[1][:4], f.readline().decode().strip())
except Exception as e:
    print("closed", e)
EOF
)
	case $ans in "true -ERR"*) ;; *) fail "tether-nats-$i answered an anonymous client: $ans" ;; esac
done
log "ok: 3 NATS servers clustered from the manifest, 2+ coordinators on it, agents enrolled, moved off a stopped coordinator, anonymous NATS clients refused"
