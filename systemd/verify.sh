#!/usr/bin/env bash
# systemd/verify.sh TETHER [--security]: check systemd/*.service with
# `systemd-analyze verify` (any message it prints is a failure: "clean"
# means silent), and with --security print `systemd-analyze security
# --offline` scores. The units name /usr/local/bin/tether, which verify
# checks for an executable; the copies checked here name TETHER (a built
# binary) instead, so nothing needs installing. `make systemd-verify` runs
# it. Exits 0 with a note when systemd-analyze is missing (Debian package
# systemd), unless REQUIRE_SYSTEMD_ANALYZE=1.
set -euo pipefail

bin=${1:?usage: systemd/verify.sh TETHER-BINARY [--security]}
security=${2:-}
[ -x "$bin" ] || { echo "verify.sh: $bin is not an executable" >&2; exit 1; }
bin=$(realpath "$bin")
cd "$(dirname "${BASH_SOURCE[0]}")"
if ! command -v systemd-analyze >/dev/null 2>&1; then
	if [ "${REQUIRE_SYSTEMD_ANALYZE:-0}" = 1 ]; then
		echo "verify.sh: systemd-analyze not found (Debian package systemd)" >&2
		exit 1
	fi
	echo "verify.sh: systemd-analyze not found (Debian package systemd): units not checked"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
units=()
for u in *.service; do
	sed "s#/usr/local/bin/tether#$bin#g" "$u" > "$tmp/$u"
	units+=("$tmp/$u")
done
if ! out=$(systemd-analyze verify "${units[@]}" 2>&1) || [ -n "$out" ]; then
	echo "systemd-analyze verify: not clean:" >&2
	echo "${out//$tmp\//systemd/}" >&2
	exit 1
fi
echo "systemd-analyze verify: clean: ${units[*]##*/}"

if [ "$security" = --security ]; then
	for u in "${units[@]}"; do
		systemd-analyze security --offline=yes --no-pager "$u" 2>&1 | grep -F 'Overall exposure level' ||
			{ echo "systemd-analyze security failed on ${u##*/}" >&2; exit 1; }
	done
fi
