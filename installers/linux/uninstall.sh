#!/bin/sh
# Remove what install.sh set up for the current user: a running lmsp-tray is stopped first
# (`lmsp-tray stop`: open streams end cleanly), then the systemd --user unit (stopped and
# disabled), the start-at-login entry, the desktop launcher, the icons, the `lmsp-tray` link
# and the virtual environment.
# Settings, the task database, tokens and models are kept unless asked:
#   --purge          also remove settings, logs and lmsp-tray's own data (~/.config/lmsp-tray,
#                    ~/.cache/lmsp-tray, ~/.local/share/lmsp-tray) and the demo model it assembled,
#                    but NOT model files you put in ~/.local/share/lmsp-tray/models
#   --delete-models  also delete the model files in ~/.local/share/lmsp-tray/models (yours too)
# Model files found elsewhere (LM Studio, Ollama, Hugging Face …) are never touched; access
# tokens stay in the OS keyring under the service name "lmsp-tray".
#
# Usage: uninstall.sh [--prefix DIR] [--purge] [--delete-models]   (--prefix as given to install.sh)
set -eu

say() { printf '%s\n' "lmsp-tray uninstall: $*"; }
die() { printf '%s\n' "lmsp-tray uninstall: error: $*" >&2; exit 1; }

prefix=""
purge=0
delete_models=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix=$2; shift 2 ;;
        --purge) purge=1; shift ;;
        --delete-models) delete_models=1; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

home=${HOME:?HOME is not set}
if [ -n "$prefix" ]; then
    data_home=$prefix/share
    bin_dir=$prefix/bin
    config_home=$prefix/config
else
    case "${XDG_DATA_HOME:-}" in /*) data_home=$XDG_DATA_HOME ;; *) data_home=$home/.local/share ;; esac
    case "${XDG_CONFIG_HOME:-}" in /*) config_home=$XDG_CONFIG_HOME ;; *) config_home=$home/.config ;; esac
    bin_dir=$home/.local/bin
fi
cache_home=$home/.cache
case "${XDG_CACHE_HOME:-}" in /*) cache_home=$XDG_CACHE_HOME ;; esac

# A running lmsp-tray first: it must not go on from a deleted venv. `lmsp-tray stop` finds it
# through its lock in the data folder and waits until it has ended.
venv=$data_home/lmsp-tray/venv
lock=$data_home/lmsp-tray/lmsp-tray.lock
if [ -x "$venv/bin/lmsp-tray" ] && ! "$venv/bin/lmsp-tray" stop --timeout 60; then
    # The program may not even run (a broken venv): only a held lock means something still runs.
    if [ -e "$lock" ] && command -v flock >/dev/null 2>&1 && ! flock -n "$lock" true; then
        die "lmsp-tray is still running and did not stop; quit it from its menu, then run this again"
    fi
    say "could not run 'lmsp-tray stop'; nothing holds its lock, so nothing runs"
fi

unit=$config_home/systemd/user/lmsp-tray.service
if [ -f "$unit" ]; then
    if [ -z "$prefix" ] && systemctl --user daemon-reload >/dev/null 2>&1; then
        systemctl --user disable --now lmsp-tray.service >/dev/null 2>&1 || true
    fi
    rm -f "$unit"
    [ -z "$prefix" ] && systemctl --user daemon-reload >/dev/null 2>&1 || true
    say "removed $unit"
fi

remove() {
    for path in "$@"; do
        if [ -e "$path" ] || [ -L "$path" ]; then
            rm -rf "$path"
            say "removed $path"
        fi
    done
}

# Start at login (written by the app: `lmsp-tray autostart enable` or the tray checkbox).
remove "$config_home/autostart/lmsp-tray.desktop"
remove "$data_home/applications/lmsp-tray.desktop"
for size in 48x48 128x128 256x256; do
    remove "$data_home/icons/hicolor/$size/apps/lmsp-tray.png"
done
if [ -L "$bin_dir/lmsp-tray" ] || [ -e "$bin_dir/lmsp-tray" ]; then
    remove "$bin_dir/lmsp-tray"
fi
remove "$venv"
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$data_home/applications" 2>/dev/null || true

models=$data_home/lmsp-tray/models
if [ "$delete_models" = 1 ]; then
    remove "$models"
fi
if [ "$purge" = 1 ]; then
    remove "$config_home/lmsp-tray" "$cache_home/lmsp-tray"
    # The demo model is lmsp-tray's own (assembled from its package); other model files are yours.
    remove "$models/gemma-3-270m-q4_k_m.gguf" "$models/gemma-3-270m-q4_k_m.gguf.partial"
    if [ -d "$data_home/lmsp-tray" ]; then
        for path in "$data_home/lmsp-tray"/* "$data_home/lmsp-tray"/.[!.]*; do
            [ -e "$path" ] || [ -L "$path" ] || continue
            [ "$path" = "$models" ] && continue
            remove "$path"
        done
        rmdir "$models" 2>/dev/null || true
        rmdir "$data_home/lmsp-tray" 2>/dev/null || true
    fi
fi
if [ -d "$models" ]; then
    count=$(find "$models" -type f | wc -l | tr -d ' ')
    say "kept $count file(s) in $models (your models; --delete-models removes them)"
fi
if [ "$purge" = 0 ] && [ -d "$data_home/lmsp-tray" ]; then
    say "kept your settings and data in $data_home/lmsp-tray and $config_home/lmsp-tray (use --purge to remove them)"
fi
say "done"
