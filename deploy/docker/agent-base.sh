#!/usr/bin/env bash
# agent-base.sh IMAGE — build the agent's base image without any registry.
#
# The agent runs users' commands, so its image needs a shell and the usual
# tools. No base image can be pulled here, so the root filesystem is made
# locally and loaded with `docker import`:
#
#   1. with debootstrap, when it is installed and DEBOOTSTRAP is not 0:
#      a Debian bookworm minbase (packages come from Debian's mirror, set
#      with DEBIAN_MIRROR); extra packages with EXTRA_PACKAGES="a,b";
#   2. otherwise, from the host: bash, dash and a fixed list of coreutils,
#      grep, sed, tar, … copied with the shared libraries `ldd` names and the
#      dynamic loader. Missing optional tools are skipped with a note.
#
# Either way the image has /tmp (1777), /root, /var/lib/tether-agent,
# CA roots and a PATH; it has no package manager in case 2.
set -euo pipefail

image=${1:-tether/agent-base:local}
mode=${DEBOOTSTRAP:-auto}
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d "${TMPDIR:-/tmp}/tether-agent-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"

log() { printf 'agent-base: %s\n' "$*" >&2; }

# copy_path SRC: copy SRC (following symlinks) into the rootfs at the path the
# host resolves its directory to, so /lib/x/libc.so.6 lands in usr/lib/x on a
# merged-/usr host and the rootfs' own bin/lib symlinks make both paths work.
copy_path() {
	local src=$1 dir dest
	dir=$(readlink -f "$(dirname "$src")")
	dest=$root$dir/$(basename "$src")
	[ -e "$dest" ] && return 0
	mkdir -p "$root$dir"
	cp -L --preserve=mode "$src" "$dest"
}

# libs_of BIN: the absolute paths of the shared objects BIN needs (incl. loader).
libs_of() {
	ldd "$1" 2>/dev/null | awk '
		$2 == "=>" && $3 ~ /^\// { print $3 }
		$1 ~ /^\// { print $1 }' || true
}

from_host() {
	# Mirror the host's merged-/usr layout (bin -> usr/bin, …) when it has one.
	local d
	mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64"
	for d in bin sbin lib lib64; do
		if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"; fi
	done

	local required=(bash sh env cat echo sleep true false kill)
	local optional=(ls mkdir rmdir rm cp mv ln touch chmod chown uname id whoami
		head tail wc grep egrep sed tar gzip find xargs sort uniq cut tr tee date
		dirname basename pwd readlink realpath stat test timeout nproc hostname
		df du seq yes printf mktemp sha256sum md5sum base64 ps pkill pgrep
		free getent nice nohup setsid flock)
	local tool path missing=()
	for tool in "${required[@]}" "${optional[@]}"; do
		# `command -v` would report shell builtins; ask for a file on PATH.
		if ! path=$(type -P "$tool"); then
			if [[ " ${required[*]} " == *" $tool "* ]]; then
				log "required tool $tool not found on the host"; exit 1
			fi
			missing+=("$tool"); continue
		fi
		copy_path "$path" # under the name it was found by (sh, not dash)
		local lib
		for lib in $(libs_of "$path"); do copy_path "$lib"; done
	done
	[ ${#missing[@]} -eq 0 ] || log "not on this host, left out: ${missing[*]}"

	mkdir -p "$root/etc"
	printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
	if [ -f /etc/os-release ]; then cp /etc/os-release "$root/etc/os-release"; fi
}

from_debootstrap() {
	local args=(--variant=minbase)
	if [ -n "${EXTRA_PACKAGES:-}" ]; then args+=("--include=$EXTRA_PACKAGES"); fi
	log "debootstrap $suite from $mirror"
	debootstrap "${args[@]}" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
		tail -n 30 "$work/debootstrap.log" >&2; return 1; }
	rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
}

use_debootstrap=no
case $mode in
0 | no | false) ;;
*) if command -v debootstrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then use_debootstrap=yes
   elif [ "$mode" != auto ]; then log "DEBOOTSTRAP=$mode but debootstrap is missing or not root"; exit 1; fi ;;
esac

# Host-assembled files belong to whoever ran this; debootstrap's keep their owners.
tar_owner=()
if [ $use_debootstrap = yes ]; then
	from_debootstrap
	source="debootstrap $suite"
else
	from_host
	source="host binaries"
	tar_owner=(--owner=0 --group=0)
fi

# Common to both: dirs the agent and jobs expect, CA roots.
mkdir -p "$root/tmp" "$root/root" "$root/var/lib/tether-agent" "$root/etc/ssl/certs" "$root/usr/local/bin"
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"
if [ ! -s "$root/etc/ssl/certs/ca-certificates.crt" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi

log "importing $source as $image"
tar -C "$root" --numeric-owner "${tar_owner[@]}" -c . |
	docker import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["/bin/bash"]' \
		--message "tether agent base from $source" \
		- "$image" >/dev/null
log "done: $(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.1f MiB", $1/1048576}')"
