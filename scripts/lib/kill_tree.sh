# kill_tree PID: end a process and every process below it (children first found, then the process itself).
# Sourced by scripts/test.sh and scripts/setup-env.sh.
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null; }
