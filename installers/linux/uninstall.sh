#!/bin/sh
# Remove what install.sh set up for the current user: the systemd --user unit
# (stopped and disabled first), the start-at-login entry, the desktop launcher,
# the icons, the `lmsp-tray` link and the virtual environment.
# Models, settings, the task database and tokens are kept unless --purge is
# given; --purge also removes ~/.local/share/lmsp-tray, ~/.config/lmsp-tray and
# ~/.cache/lmsp-tray (model files found elsewhere are never touched; access
# tokens stay in the OS keyring under the service name "lmsp-tray").
#
# Usage: uninstall.sh [--prefix DIR] [--purge]   (--prefix as given to install.sh)
set -eu

say() { printf '%s\n' "lmsp-tray uninstall: $*"; }
die() { printf '%s\n' "lmsp-tray uninstall: error: $*" >&2; exit 1; }

prefix=""
purge=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix=$2; shift 2 ;;
        --purge) purge=1; shift ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
remove "$data_home/lmsp-tray/venv"
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$data_home/applications" 2>/dev/null || true

if [ "$purge" = 1 ]; then
    remove "$data_home/lmsp-tray" "$config_home/lmsp-tray" "$cache_home/lmsp-tray"
else
    [ -d "$data_home/lmsp-tray" ] && say "kept your data in $data_home/lmsp-tray (use --purge to remove it)"
fi
say "done"
