# Shared settings for hack/ scripts. Source it; do not run it.
# Everything downloaded lives under one cache folder so a second run fetches nothing.
set -euo pipefail
KDSYNC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KDSYNC_ROOT
export KDSYNC_CACHE="${KDSYNC_CACHE:-$HOME/.cache/kdsync}"
mkdir -p "$KDSYNC_CACHE"

say() { printf '\033[1m[kdsync]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31m[kdsync] error:\033[0m %s\n' "$*" >&2; exit 1; }
