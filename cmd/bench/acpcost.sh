#!/bin/bash
# cmd/bench/acpcost.sh [N]: what a turn costs over each agent protocol (docs/agents.md): claim → first agent event and CPU per turn, lines vs acp, real binaries
# (controlplane serve on SQLite, runnerd run --sandbox process --capacity 2).
set -eu
N=${1:-30}
B=$(cd "${BIN:-$(dirname "$0")/../../bin}" && pwd) # make build leaves the binaries there
D=$(mktemp -d /tmp/acpcost.XXXX)
P=$((20000 + RANDOM % 20000))
$B/controlplane serve --data-dir $D/cp --listen 127.0.0.1:$P > $D/cp.log 2>&1 &
CP=$!
trap "kill \$CP \$RD 2>/dev/null; sleep 1; pkill -f $D/state 2>/dev/null || true" EXIT
RD=
for i in $(seq 50); do [ -f $D/cp/user-token ] && break; sleep 0.1; done
$B/controlplane host add h1 --data-dir $D/cp --token-file $D/tok >/dev/null
$B/runnerd run --control-plane http://127.0.0.1:$P --host-token-file $D/tok --host-name h1 --state-dir $D/state --sandbox process --capacity 2 > $D/rd.log 2>&1 &
RD=$!
sleep 2
cpu() { # total CPU ticks of runnerd and every process of its state dir (supervisors, agents), with reaped children
  local t=0
  for p in $RD $(pgrep -f "$D/state" || true); do
    [ -r /proc/$p/stat ] || continue
    set -- $(sed 's/^.*) //' /proc/$p/stat)
    t=$((t + ${12} + ${13} + ${14} + ${15}))
  done
  echo $t
}
S="--server http://127.0.0.1:$P --data-dir $D/cp"
for proto in lines acp; do
  agent="$B/demoagent"; pol=""; [ $proto = acp ] && agent="$B/demoagent --acp" && pol="--permission-policy allow"
  out=$($B/controlplane submit $S --new --agent-protocol $proto $pol --image process --agent "$agent" --prompt warm --json 2>&1 | head -c 100000)
  conv=$(grep -o '"conversation_id":"[^"]*"' <<<"$out" | head -1 | cut -d'"' -f4)
  [ -n "$conv" ] || conv=$(curl -s -H "Authorization: Bearer $(cat $D/cp/user-token)" "http://127.0.0.1:$P/v1/jobs?limit=1" | jq -r '.jobs[0].conversation_id')
  c0=$(cpu)
  for i in $(seq $N); do
    $B/controlplane submit $S --conversation $conv --prompt "turn $i" >/dev/null
  done
  c1=$(cpu)
  curl -s -H "Authorization: Bearer $(cat $D/cp/user-token)" "http://127.0.0.1:$P/v1/jobs?conversation=$conv&limit=200" > $D/jobs-$proto.json
  for j in $(jq -r '.jobs[].id' $D/jobs-$proto.json); do
    curl -s -H "Authorization: Bearer $(cat $D/cp/user-token)" "http://127.0.0.1:$P/v1/jobs/$j"
    echo
  done > $D/detail-$proto.jsonl
  tck=$(getconf CLK_TCK)
  python3 - "$D/detail-$proto.jsonl" "$proto" "$c0" "$c1" "$tck" "$N" <<'PY'
import json,sys
from datetime import datetime
def t(s): 
    s=s.replace('Z','+00:00')
    if '.' in s:
        a,b=s.split('.',1); frac,tz=b[:b.index('+')],b[b.index('+'):]
        s=a+'.'+(frac+'000000')[:6]+tz
    return datetime.fromisoformat(s)
path,proto,c0,c1,tck,n=sys.argv[1:]
lat=[]
for line in open(path):
    line=line.strip()
    if not line: continue
    j=json.loads(line)
    if j.get('prompt','').startswith('warm'): continue
    ev=j.get('events') or []
    claimed=[e for e in ev if e['type']=='claimed']
    first=[e for e in ev if e['source']=='runner']
    if claimed and first:
        lat.append((t(first[0]['time'])-t(claimed[0]['time'])).total_seconds()*1000)
lat.sort()
p=lambda q: lat[min(len(lat)-1,int(q*len(lat)))]
print(f"{proto}: {len(lat)} turns, claim -> first agent event p50 {p(.5):.1f} ms p90 {p(.9):.1f} ms; CPU per turn {(int(c1)-int(c0))/int(tck)/int(n)*1000:.1f} ms (runnerd, children, supervisor, agent)")
PY
done
