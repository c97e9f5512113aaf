# Sourced by scripts/demo, scripts/test and scripts/deps: they need root (packages, network
# namespaces, XDP) and cargo.
#
# as_root "$@": as root, does nothing (never calls sudo, which a root-only Debian may not
# have). Otherwise re-runs the calling script through sudo, passing the cargo found here
# (sudo's secure_path usually lacks ~/.cargo/bin), or says what to do when sudo is absent.
#
# use_cargo: puts a cargo on the PATH: the one already there, else the one as_root passed
# (XVS_CARGO_DIR), ~/.cargo/bin, the invoking sudo user's ~/.cargo/bin, /root/.cargo/bin.
# A rustup proxy in another user's home also gets that home's RUSTUP_HOME. Returns 1 if none.

# shellcheck shell=bash
find_cargo_dir() {
  local c dir
  if c=$(command -v cargo 2>/dev/null); then dirname "$c"; return 0; fi
  local sudo_home=""
  [ -n "${SUDO_USER:-}" ] && sudo_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
  for dir in "${XVS_CARGO_DIR:-}" "${CARGO_HOME:+$CARGO_HOME/bin}" "${HOME:-/nonexistent}/.cargo/bin" \
    "${sudo_home:+$sudo_home/.cargo/bin}" /root/.cargo/bin; do
    [ -n "$dir" ] && [ -x "$dir/cargo" ] && { echo "$dir"; return 0; }
  done
  return 1
}

as_root() {
  [ "$(id -u)" -eq 0 ] && return 0
  local script dir
  script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  if ! command -v sudo >/dev/null 2>&1; then
    echo "$(basename "$0"): needs root (network namespaces, XDP, packages) and sudo is not installed: run it as root (su -c '$script')" >&2
    exit 1
  fi
  dir=$(find_cargo_dir || true)
  echo "$(basename "$0"): not root: running it again through sudo" >&2
  # `env` as the command: passing variables needs no SETENV right in sudoers.
  exec sudo env ${dir:+XVS_CARGO_DIR="$dir"} ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} \
    ${RUSTUP_TOOLCHAIN:+RUSTUP_TOOLCHAIN="$RUSTUP_TOOLCHAIN"} "$script" "$@"
}

use_cargo() {
  local dir home
  dir=$(find_cargo_dir) || return 1
  case ":$PATH:" in *":$dir:"*) ;; *) export PATH="$dir:$PATH" ;; esac
  # A rustup proxy finds its toolchains under RUSTUP_HOME (default ~/.rustup of the
  # current HOME, root's under sudo): point it at the home the proxy lives in.
  home=${dir%/.cargo/bin}
  if [ -z "${RUSTUP_HOME:-}" ] && [ "$home" != "$dir" ] && [ "$home" != "${HOME:-}" ] &&
    [ -d "$home/.rustup" ]; then
    export RUSTUP_HOME="$home/.rustup"
  fi
  return 0
}
