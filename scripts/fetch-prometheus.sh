#!/usr/bin/env bash
# Puts Debian's `prometheus` and `promtool` into a virtualenv's bin/, without root: the package
# is downloaded with `apt-get download` and unpacked with `dpkg -x` under VENV/prometheus. The
# machine's package lists are used when they know the package; otherwise private lists are
# fetched into VENV/prometheus (apt-get update with its own state directory needs no root).
#   scripts/fetch-prometheus.sh .venv
set -euo pipefail
venv="$(cd "${1:?usage: scripts/fetch-prometheus.sh VENV}" && pwd)"
work="$venv/prometheus"
rm -rf "$work/deb" "$work/root"
mkdir -p "$work/deb"
cd "$work/deb"
if ! apt-get -qq download prometheus 2>/dev/null; then
  lists="$work/apt-lists"
  mkdir -p "$lists/partial"
  private=(-o "Dir::State::Lists=$lists" -o Debug::NoLocking=1)
  apt-get "${private[@]}" -qq update
  apt-get "${private[@]}" -qq download prometheus
fi
dpkg -x prometheus_*.deb "$work/root"
for tool in prometheus promtool; do
  ln -sf "$work/root/usr/bin/$tool" "$venv/bin/$tool"
done
"$venv/bin/promtool" --version 2>&1 | head -n 1
