# scripts/lib/debian_deps.sh: sourced by scripts/main.sh and scripts/test.sh.
# ensure_build_tools [gtest]: installs, with apt-get, the Debian packages of the build that are
# missing (cmake, ninja, g++, python3-venv, and GoogleTest when "gtest" is given); needs root or
# sudo only when something is missing.
ensure_build_tools() {
  local need=()
  command -v cmake >/dev/null || need+=(cmake)
  command -v ninja >/dev/null || need+=(ninja-build)
  command -v g++ >/dev/null || need+=(g++)
  python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
  if [ "${1:-}" = "gtest" ] && [ ! -f /usr/include/gtest/gtest.h ]; then need+=(libgtest-dev); fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${need[*]}"
    local sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
  fi
}
