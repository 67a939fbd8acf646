# Sourced: a Python virtual environment under $GSNAP_CACHE with the test and benchmark
# dependencies (psycopg, pytest, matplotlib), created on first use.
GSNAP_VENV=$GSNAP_CACHE/venv
if [ ! -x "$GSNAP_VENV/bin/python" ] || ! "$GSNAP_VENV/bin/python" -c 'import psycopg, pytest, matplotlib' 2>/dev/null; then
    log "preparing the Python environment for tests and benchmarks"
    python3 -m venv "$GSNAP_VENV"
    "$GSNAP_VENV/bin/pip" install -q --upgrade pip
    "$GSNAP_VENV/bin/pip" install -q -r "$GSNAP_ROOT/tests/requirements.txt"
fi
export PATH="$GSNAP_VENV/bin:$PATH"
