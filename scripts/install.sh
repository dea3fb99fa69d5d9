#!/usr/bin/env sh
# Install genvi and its dependencies (ranges, see pyproject.toml) into the current Python
# environment; GENVI_CONSTRAINTS names a file of exact versions (CI's: constraints/).
# The Dockerfile runs this script, .ci/run runs it, and tests/test_install.py runs it
# (resolving the CUDA variant with --dry-run), so the install steps live only here.
#
#   scripts/install.sh                     # CPU (the default)
#   GENVI_DEVICE=cuda scripts/install.sh   # NVIDIA GPU: JAX's CUDA 12 plugin
#   GENVI_EXTRAS=test scripts/install.sh   # also the test tools (pytest, nbclient, ...)
#   GENVI_CONSTRAINTS=constraints/newest.txt scripts/install.sh   # CI's exact versions
#   GENVI_EXPERIMENTS=1 scripts/install.sh # also genvi's experiments and benchmarks
#                                          # (experiments/, a project beside genvi)
#
# Other settings: GENVI_EDITABLE=1 installs in development mode (pip -e);
# GENVI_PIP_ARGS passes options to pip (for example --dry-run); GENVI_INSTALLER=uv
# installs with uv (fetched with pip first; the same packages, downloaded in parallel:
# what CI uses, several times faster than pip on a fresh machine).
set -eu
cd "$(dirname "$0")/.."

device="${GENVI_DEVICE:-cpu}"
extras="${GENVI_EXTRAS:-}"
case "$device" in
  cpu) ;;
  cuda) extras="${extras:+$extras,}cuda" ;;
  *) echo "install.sh: GENVI_DEVICE=$device is not a device; use cpu or cuda" >&2; exit 2 ;;
esac
target="."
if [ -n "$extras" ]; then target=".[$extras]"; fi
if [ "${GENVI_EDITABLE:-0}" = "1" ]; then target="-e $target"; fi
case "${GENVI_EXPERIMENTS:-0}" in
  0) ;;
  1) if [ "${GENVI_EDITABLE:-0}" = "1" ]; then target="$target -e ./experiments"
     else target="$target ./experiments"; fi ;;
  *) echo "install.sh: GENVI_EXPERIMENTS=${GENVI_EXPERIMENTS} is not 0 or 1" >&2; exit 2 ;;
esac
constraints=""
if [ -n "${GENVI_CONSTRAINTS:-}" ]; then constraints="-c ${GENVI_CONSTRAINTS}"; fi

case " ${GENVI_PIP_ARGS:-} " in
  *" --dry-run "*) dry_run=1 ;;
  *) dry_run=0 ;;
esac
installer="${GENVI_INSTALLER:-pip}"
case "$installer" in
  pip|uv) ;;
  *) echo "install.sh: GENVI_INSTALLER=$installer is not an installer; use pip or uv" >&2; exit 2 ;;
esac
if [ "$dry_run" = 0 ]; then python -m pip install --quiet --upgrade pip; fi
# a dry run prints what it would install; a real one stays quiet
if [ "$dry_run" = 1 ]; then quiet=""; else quiet="--quiet"; fi
if [ "$installer" = uv ]; then
  python -m pip install --quiet --no-cache-dir uv
  # shellcheck disable=SC2086 # target, quiet, constraints, GENVI_PIP_ARGS: lists of words
  UV_NO_CACHE=1 python -m uv pip install --python "$(command -v python)" $quiet $constraints \
    ${GENVI_PIP_ARGS:-} $target
else
  # shellcheck disable=SC2086 # target, quiet, constraints, GENVI_PIP_ARGS: lists of words
  python -m pip install $quiet --no-cache-dir $constraints ${GENVI_PIP_ARGS:-} $target
fi
if [ "$dry_run" = 1 ]; then
  echo "install.sh: resolved genvi for $device (dry run)"
else
  python -c "import jax, genvi; print('genvi', genvi.__version__, 'on JAX', jax.__version__, 'devices:', jax.devices())"
fi
