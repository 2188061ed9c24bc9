#!/usr/bin/env bash
# Two engineers apply to ONE shared state at the same time: alice changes module.web, bob changes
# module.db. Both applies run in parallel and both commit. Then carol and dave both change
# module.web: the second gets the reservation conflict and exit code 2.
#
# Needs only this repository's virtualenv (./dev setup): the server runs on an embedded Postgres
# in a temporary directory, and Terraform is the embedded kl-terraform.
#   DEMO_SLEEP=10  seconds each created server sleeps (default 10)
#   DEMO_PORT=18480
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
KL=${KL:-$repo/.venv/bin/kl}
TF=${TF:-$repo/.venv/bin/kl-terraform}
SLEEP=${DEMO_SLEEP:-10}
PORT=${DEMO_PORT:-18480}
PY=${PYTHON:-$repo/.venv/bin/python}

work=$(mktemp -d)
export KL_DATA_DIR="$work/data" TF_CLI_CONFIG_FILE="$work/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
unset KL_DATABASE_URL KL_AUTH_MODE KL_ADDRESS KL_STATE KL_TOKEN TF_HTTP_ADDRESS TF_HTTP_PASSWORD TF_HTTP_USERNAME || true
: > "$TF_CLI_CONFIG_FILE"
address="http://127.0.0.1:$PORT/v1/states/demo"

"$KL" serve --port "$PORT" > "$work/server.log" 2>&1 &
server=$!
cleanup() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    "$KL" embedded stop > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
    "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/healthz', timeout=1)" \
        > /dev/null 2>&1 && break
    sleep 0.2
done

checkout() {  # checkout NAME [sed-expression]: a copy of the configuration with the backend block
    local dir="$work/$1"
    cp -r "$here/config" "$dir"
    cat > "$dir/backend.tf" <<HCL
terraform {
  backend "http" {
    address        = "$address"
    lock_address   = "$address"
    unlock_address = "$address"
    lock_method    = "LOCK"
    unlock_method  = "UNLOCK"
  }
}
HCL
    if [ -n "${2:-}" ]; then sed -i "$2" "$dir/main.tf"; fi
    echo "$dir"
}

echo "== the trunk: a vanilla terraform apply creates the state (no sleeps)"
trunk=$(checkout trunk)
(cd "$trunk" && "$TF" init -input=false > /dev/null && "$TF" apply -auto-approve -input=false -var sleep=0 | tail -1)

echo
echo "== alice changes module.web, bob changes module.db; both plan"
alice=$(checkout alice '/variable "web_version"/,/}/ s/default = "1"/default = "2"/')
bob=$(checkout bob '/variable "db_version"/,/}/ s/default = "1"/default = "2"/')
(cd "$alice" && "$KL" plan -var "sleep=$SLEEP" | sed 's/^/alice: /')
(cd "$bob" && "$KL" plan -var "sleep=$SLEEP" | sed 's/^/bob:   /')

echo
echo "== both apply at the same time (each server sleeps ${SLEEP}s while it is created)"
start=$("$PY" -c 'import time; print(time.time())')
(cd "$alice" && "$KL" apply kl-plan.json --actor alice > "$work/alice.out" 2>&1; echo $? > "$work/alice.rc") &
(cd "$bob" && "$KL" apply kl-plan.json --actor bob > "$work/bob.out" 2>&1; echo $? > "$work/bob.rc") &
wait %2 %3 2>/dev/null || wait
end=$("$PY" -c 'import time; print(time.time())')
sed 's/^/alice: /' "$work/alice.out" | grep -v '│' || true
sed 's/^/bob:   /' "$work/bob.out" | grep -v '│' || true
"$PY" -c "print(f'both applies finished in {$end - $start:.1f}s (each alone takes at least ${SLEEP}s)')"
[ "$(cat "$work/alice.rc")" = 0 ] && [ "$(cat "$work/bob.rc")" = 0 ]

echo
echo "== what apply_runs says"
"$KL" runs --address "$address" --json > "$work/runs.json"
"$PY" - "$work/runs.json" <<'PYEOF'
import json, sys
from datetime import datetime
runs = {r["actor"]: r for r in json.load(open(sys.argv[1]))}
a, b = runs["alice"], runs["bob"]
for r in (a, b):
    print(f"{r['actor']:<6} {r['id']}  {r['status']}  {r['started_at'][11:23]} -> {r['finished_at'][11:23]}"
          f"  committed serial {r['committed_serial']}")
t = datetime.fromisoformat
assert a["status"] == b["status"] == "committed", "both applies must commit"
assert t(a["started_at"]) < t(b["finished_at"]) and t(b["started_at"]) < t(a["finished_at"]), "windows must overlap"
overlap = min(t(a["finished_at"]), t(b["finished_at"])) - max(t(a["started_at"]), t(b["started_at"]))
print(f"the two run windows overlapped for {overlap.total_seconds():.1f}s; both write sets landed")
PYEOF

echo
echo "== vanilla terraform over the merged configuration sees no changes"
merged=$(checkout merged 's/default = "1"/default = "2"/')
(cd "$merged" && "$TF" init -input=false > /dev/null && "$TF" plan -detailed-exitcode -input=false -var "sleep=$SLEEP" > /dev/null && echo "terraform plan: no changes")

echo
echo "== carol and dave both change module.web"
carol=$(checkout carol '/variable "web_version"/,/}/ s/default = "1"/default = "3"/; /variable "db_version"/,/}/ s/default = "1"/default = "2"/')
dave=$(checkout dave '/variable "web_version"/,/}/ s/default = "1"/default = "4"/; /variable "db_version"/,/}/ s/default = "1"/default = "2"/')
(cd "$carol" && "$KL" plan -var "sleep=$SLEEP" > /dev/null)
(cd "$dave" && "$KL" plan -var "sleep=$SLEEP" > /dev/null)
(cd "$carol" && "$KL" apply kl-plan.json --actor carol > "$work/carol.out" 2>&1) &
carol_job=$!
for _ in $(seq 1 100); do
    "$KL" reservations --address "$address" --json | grep -q '"carol"' && break
    sleep 0.1
done
set +e
(cd "$dave" && "$KL" apply kl-plan.json --actor dave)
rc=$?
set -e
echo "dave's kl apply exited $rc"
wait "$carol_job"
[ "$rc" = 2 ]
echo
echo "demo passed"
